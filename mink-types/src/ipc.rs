//! A record batch's Arrow IPC encoding as a client sent it.

use arrow::buffer::Buffer;

/// The Arrow IPC encoding of one record batch as it arrived (Flight's `data_header`
/// and `data_body`): the flatbuffer `Message` and the body it describes. A node that
/// has decoded these bytes and checked the batch against a table schema whose Arrow
/// types are exactly the batch's stores them as they are instead of encoding the rows
/// again: decoded with the table's schema they give the same batch.
#[derive(Debug, Clone)]
pub struct IpcEncoded {
    /// The flatbuffer `Message` (a record batch header), without framing.
    pub message: Buffer,
    /// The body: the buffers the message points into.
    pub body: Buffer,
}

impl IpcEncoded {
    /// Bytes of message and body together.
    pub fn len(&self) -> usize {
        self.message.len() + self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
