//! Kafka framing: every request and response is a 4-byte big-endian length and that
//! many bytes. The length is checked against `max_request_bytes` before any of the
//! body is read, so an oversized frame costs four bytes of memory, not its size. Also
//! what a frame carries once decoded: a request's [`Header`], and a response [`Body`].

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::Encodable;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Why a frame could not be read. Every one of them ends the connection.
#[derive(Debug)]
pub enum FrameError {
    /// The length prefix is larger than `max_request_bytes`.
    Oversized {
        size: i64,
        max: u64,
    },
    /// The length prefix is negative, or too short to hold a request header.
    BadLength(i32),
    /// The peer closed the connection in the middle of a frame.
    Truncated {
        expected: usize,
        got: usize,
    },
    Io(std::io::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Oversized { size, max } => write!(
                f,
                "a frame of {size} bytes is larger than kafka.max_request_bytes ({max})"
            ),
            FrameError::BadLength(n) => write!(f, "a frame length of {n} bytes is not valid"),
            FrameError::Truncated { expected, got } => write!(
                f,
                "the connection closed {got} bytes into a frame of {expected} bytes"
            ),
            FrameError::Io(e) => write!(f, "reading a frame: {e}"),
        }
    }
}

/// The shortest request: api key, api version and correlation id.
pub const REQUEST_HEADER_BYTES_MIN: i32 = 8;

/// Reads one frame's body. `Ok(None)` when the peer closed the connection between
/// frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_bytes: u64,
) -> Result<Option<Bytes>, FrameError> {
    let mut prefix = [0u8; 4];
    let got = read_full(reader, &mut prefix).await?;
    if got == 0 {
        return Ok(None);
    }
    if got < 4 {
        return Err(FrameError::Truncated { expected: 4, got });
    }
    let size = i32::from_be_bytes(prefix);
    if size < REQUEST_HEADER_BYTES_MIN {
        return Err(FrameError::BadLength(size));
    }
    if size as u64 > max_bytes {
        return Err(FrameError::Oversized {
            size: size as i64,
            max: max_bytes,
        });
    }
    // Filled as it arrives, never zeroed first: zeroing touched every page of a frame
    // before a byte of it came (2% of the node's CPU under a produce load), and a
    // peer that never sends the body would hold that much committed memory.
    let size = size as usize;
    let mut body = BytesMut::with_capacity(size);
    let mut rest = reader.take(size as u64);
    while body.len() < size {
        if rest.read_buf(&mut body).await.map_err(FrameError::Io)? == 0 {
            return Err(FrameError::Truncated {
                expected: size,
                got: body.len(),
            });
        }
    }
    Ok(Some(body.freeze()))
}

/// Fills `buf` unless the peer closes first; returns the bytes read.
async fn read_full<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut [u8],
) -> Result<usize, FrameError> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = reader
            .read(&mut buf[filled..])
            .await
            .map_err(FrameError::Io)?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

/// `body` with its length prefix.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A request's header, as read.
pub(crate) struct Header {
    pub key: ApiKey,
    pub version: i16,
    pub header: RequestHeader,
    /// The client's address.
    pub peer: SocketAddr,
}

/// An encoded response body and the version it was encoded at.
pub(crate) struct Body {
    pub version: i16,
    pub bytes: Bytes,
}

/// Encodes a response body at `version`; a failure is a bug (a field set that the
/// version lacks), logged, and answered as an empty body the client will reject.
pub(crate) fn encode<T: Encodable>(key: ApiKey, value: &T, version: i16) -> Body {
    let mut buf = BytesMut::new();
    if let Err(e) = value.encode(&mut buf, version) {
        tracing::error!("kafka: encoding a {key:?} v{version} response: {e}");
        buf.clear();
    }
    Body {
        version,
        bytes: buf.freeze(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(bytes: &[u8], max: u64) -> Result<Option<Bytes>, FrameError> {
        let mut r = bytes;
        read_frame(&mut r, max).await
    }

    #[tokio::test]
    async fn frames_are_read_whole_and_one_after_another() {
        let mut two = frame(b"0123456789");
        two.extend(frame(b"abcdefgh"));
        let mut r = &two[..];
        assert_eq!(
            read_frame(&mut r, 1024).await.unwrap().unwrap(),
            &b"0123456789"[..]
        );
        assert_eq!(
            read_frame(&mut r, 1024).await.unwrap().unwrap(),
            &b"abcdefgh"[..]
        );
        assert!(read_frame(&mut r, 1024).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn an_oversized_frame_is_refused_from_its_length_alone() {
        // Only the prefix is sent: the body is never waited for.
        let err = read(&(1_000_000u32).to_be_bytes(), 1024).await.unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::Oversized {
                    size: 1_000_000,
                    max: 1024
                }
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "a frame of 1000000 bytes is larger than kafka.max_request_bytes (1024)"
        );
    }

    #[tokio::test]
    async fn bad_and_truncated_frames_are_precise_errors() {
        let err = read(&(-5i32).to_be_bytes(), 1024).await.unwrap_err();
        assert!(matches!(err, FrameError::BadLength(-5)), "{err}");
        let err = read(&3i32.to_be_bytes(), 1024).await.unwrap_err();
        assert!(matches!(err, FrameError::BadLength(3)), "{err}");
        let err = read(&[0, 0], 1024).await.unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::Truncated {
                    expected: 4,
                    got: 2
                }
            ),
            "{err}"
        );
        let mut cut = frame(b"0123456789");
        cut.truncate(9);
        let err = read(&cut, 1024).await.unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::Truncated {
                    expected: 10,
                    got: 5
                }
            ),
            "{err}"
        );
    }
}
