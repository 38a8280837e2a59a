//! mink-wal's error type. It knows nothing of tables: callers map it to theirs.

/// A `Result` with [`WalError`].
pub type WalResult<T> = std::result::Result<T, WalError>;

/// Everything that can go wrong in the object-store toolkit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalError {
    /// A configuration value is invalid; the message names the key.
    #[error("configuration: {0}")]
    Config(String),
    /// The object store failed or timed out. Nothing was acknowledged.
    #[error("object store: {0}")]
    Storage(String),
    /// Another owner took over (a newer epoch, or this WAL was fenced). Nothing more
    /// is acknowledged by this writer.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The stream is closed.
    #[error("closed: {0}")]
    Closed(String),
    /// A read below the start offset.
    #[error("offset {offset} is below the start offset {start} of stream {stream}")]
    OffsetOutOfRange {
        stream: String,
        offset: u64,
        start: u64,
    },
    /// A payload or request over a limit.
    #[error("too large: {0}")]
    TooLarge(String),
    /// An object could not be decoded (bad magic, CRC, truncation) or an invariant of
    /// the stored data does not hold.
    #[error("corrupt data: {0}")]
    Corrupt(String),
}

impl From<object_store::Error> for WalError {
    fn from(err: object_store::Error) -> Self {
        WalError::Storage(err.to_string())
    }
}
