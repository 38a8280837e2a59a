//! CRC32C combination in O(log n) multiplications of 32-bit polynomials.
//!
//! `crc(A ‖ B)` is `crc(A) · x^(8·|B|) + crc(B)` modulo the Castagnoli polynomial
//! (the pre- and post-conditioning of both CRCs cancel out), so combining needs only
//! `x^(8·|B|) mod P`, a product of precomputed `x^(2^k) mod P`. The `crc32c` crate's
//! `crc32c_combine` squares 32×32 bit matrices once per bit of the length instead:
//! ~15 µs for a 64 KiB record on this machine, more than computing the CRC of the bytes
//! again, and a fifth of the WAL's CPU in `bench wal` (docs/benchmarks.md). This one
//! costs well under a microsecond.

/// CRC32C's polynomial, bit-reflected: bit 31 holds the coefficient of x^0.
const POLY: u32 = 0x82F6_3B78;

/// `a(x) · b(x) mod P`, both reflected.
const fn multiply(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = 0;
    while bit < 32 {
        // Coefficient of x^bit in a.
        if a & (1 << (31 - bit)) != 0 {
            product ^= b;
        }
        // b · x: one place towards x^31, reducing what passes it.
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        bit += 1;
    }
    product
}

/// `x^(2^k) mod P` for k in 0..64, by repeated squaring (no assumption on the order
/// of x).
const X_POW_2K: [u32; 64] = {
    let mut table = [0u32; 64];
    table[0] = 1 << 30; // x^1
    let mut k = 1;
    while k < 64 {
        table[k] = multiply(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// `x^(8·n) mod P`: appending `n` bytes shifts a CRC by this factor.
fn x_pow_8n(n: u64) -> u32 {
    let mut result = 1 << 31; // x^0
    let mut k = 3; // 8·n = n · 2^3
    let mut n = n;
    while n != 0 {
        if n & 1 != 0 {
            result = multiply(X_POW_2K[k], result);
        }
        n >>= 1;
        k += 1;
    }
    result
}

/// The CRC32C of `A ‖ B`, from `crc_a` = CRC32C of A, `crc_b` = CRC32C of B, and
/// `len_b` = the length of B in bytes.
pub fn combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    if len_b == 0 {
        return crc_a;
    }
    multiply(x_pow_8n(len_b), crc_a) ^ crc_b
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn combining_equals_the_crc_of_the_concatenation() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut data = vec![0u8; 300_000];
        rng.fill(&mut data[..]);
        let mut splits = vec![(0, 0), (0, 1), (1, 1), (0, 300_000), (300_000, 0)];
        for _ in 0..200 {
            let a = rng.random_range(0..data.len());
            let b = rng.random_range(0..=data.len() - a);
            splits.push((a, b));
        }
        for (a, b) in splits {
            let (first, second) = (&data[..a], &data[a..a + b]);
            let want = crc32c::crc32c(&data[..a + b]);
            let got = combine(crc32c::crc32c(first), crc32c::crc32c(second), b as u64);
            assert_eq!(got, want, "split {a} + {b}");
            assert_eq!(
                got,
                crc32c::crc32c_combine(crc32c::crc32c(first), crc32c::crc32c(second), b)
            );
        }
    }

    #[test]
    fn a_long_second_part_shifts_the_first_crc_correctly() {
        // 5 bytes, then 256 MiB of zeros streamed through the plain CRC: table entries
        // up to x^(2^31).
        let head = [3u8, 1, 4, 1, 5];
        let zeros = vec![0u8; 1 << 20];
        let (mut whole, mut tail) = (crc32c::crc32c(&head), crc32c::crc32c(&[]));
        for _ in 0..256 {
            whole = crc32c::crc32c_append(whole, &zeros);
            tail = crc32c::crc32c_append(tail, &zeros);
        }
        assert_eq!(combine(crc32c::crc32c(&head), tail, 1 << 28), whole);
    }

    #[test]
    fn shifts_compose_beyond_four_gigabytes() {
        // x^(8(a+b)) = x^(8a) · x^(8b), for lengths whose bits reach past 2^32.
        for (a, b) in [
            (1u64 << 32, 1u64 << 32),
            (3 << 31, 5 << 33),
            (u32::MAX as u64, 1),
        ] {
            assert_eq!(
                x_pow_8n(a + b),
                multiply(x_pow_8n(a), x_pow_8n(b)),
                "{a} + {b}"
            );
        }
    }
}
