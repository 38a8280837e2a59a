"""What the chaos harness's Python helpers share (mink-node/tests/it/chaos.rs)."""


def live_addresses(path):
    """The addresses the harness lists in `path`, one per line: those of the nodes
    running now (they restart on new ports). Empty while the file is missing."""
    try:
        with open(path) as f:
            return [a for a in f.read().split() if a]
    except OSError:
        return []
