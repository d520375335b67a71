//! The interface the server drives: anything that stores bytes at offsets and completes later.

use std::fmt;

use crate::proto;

/// Completion of a read: the buffer handed in, now filled, or why it could not be.
pub type ReadDone<B> = Box<dyn FnOnce(Result<B, IoError>) + Send>;
/// Completion of any other request.
pub type Done = Box<dyn FnOnce(Result<(), IoError>) + Send>;

/// A block device the server can export. The engine's virtual drives implement it; so does
/// [`crate::testing::MemDevice`].
///
/// Every request completes by calling its `done` exactly once, from any thread (the engine's
/// shard threads), possibly before the submitting call returns. The server never has more than
/// its configured number of requests in flight per connection, and checks every request against
/// `size_bytes` and `block_size_bytes` before submitting it: a device sees only aligned,
/// in-range requests of at most [`proto::PAYLOAD_MAX_BYTES`] (TRIM may be longer).
pub trait BlockDevice: Send + Sync + 'static {
    /// A buffer from the device's pool. The server reads a WRITE's payload into it and sends a
    /// READ's reply from it, so no byte is copied between the socket and the device.
    type Buf: AsRef<[u8]> + AsMut<[u8]> + Send + 'static;

    fn size_bytes(&self) -> u64;
    /// Smallest I/O unit, a power of two from 512 to 64 KiB: requests not aligned to it get
    /// NBD_EINVAL (storc uses 512).
    fn block_size_bytes(&self) -> u32;
    /// A buffer of exactly `len_bytes` bytes, aligned as the device needs. May block while the
    /// pool is empty: that is backpressure on the connection's reader.
    fn alloc(&self, len_bytes: usize) -> Self::Buf;
    /// Whether FLUSH on one connection makes writes completed on every connection durable
    /// (advertised as NBD_FLAG_CAN_MULTI_CONN).
    fn flush_is_global(&self) -> bool;
    /// Whether TRIM really deallocates and later reads return zeros (NBD_FLAG_SEND_TRIM is
    /// advertised only if true).
    fn supports_trim(&self) -> bool;

    /// Fills `buf` (its full length) from `offset`.
    fn read(&self, offset: u64, buf: Self::Buf, done: ReadDone<Self::Buf>);
    /// Writes all of `buf` at `offset`; with `fua`, completes only once the data is durable.
    fn write(&self, offset: u64, buf: Self::Buf, fua: bool, done: Done);
    /// Completes once every write completed before it was submitted is durable.
    fn flush(&self, done: Done);
    /// Deallocates the range; later reads return zeros. Called only if `supports_trim`.
    fn trim(&self, offset: u64, len_bytes: u64, done: Done);
    /// Makes the range read as zeros, and may deallocate it: the server sends requests with
    /// NBD_CMD_FLAG_NO_HOLE as ordinary writes of zeros instead, so that they stay allocated.
    fn write_zeroes(&self, offset: u64, len_bytes: u64, fua: bool, done: Done);
}

/// Why a device request failed. Each variant maps to one NBD error value in
/// [`IoError::nbd_error`]; the server's own request checks use the same variants, so that
/// mapping is the only place NBD error codes are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoError {
    /// The device could not read or write (a VD that lost too many members).
    Io,
    /// Out of space, or a write past the end of the device.
    NoSpace,
    /// A request that breaks the rules: misaligned, past the end for a read, unknown flag.
    Invalid,
    /// A write to something read-only.
    NotPermitted,
    /// The device or server is going away.
    ShuttingDown,
}

impl IoError {
    /// The NBD error value for this error: the one `match` from errors to the wire.
    pub fn nbd_error(self) -> u32 {
        match self {
            IoError::Io => proto::NBD_EIO,
            IoError::NoSpace => proto::NBD_ENOSPC,
            IoError::Invalid => proto::NBD_EINVAL,
            IoError::NotPermitted => proto::NBD_EPERM,
            IoError::ShuttingDown => proto::NBD_ESHUTDOWN,
        }
    }
}

impl fmt::Display for IoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            IoError::Io => "I/O error",
            IoError::NoSpace => "no space left on device",
            IoError::Invalid => "invalid request",
            IoError::NotPermitted => "operation not permitted",
            IoError::ShuttingDown => "shutting down",
        };
        f.write_str(text)
    }
}

impl std::error::Error for IoError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_the_spec_value() {
        let check = |error: IoError, expected: u32| assert_eq!(error.nbd_error(), expected, "{error:?}");
        check(IoError::Io, 5);
        check(IoError::NoSpace, 28);
        check(IoError::Invalid, 22);
        check(IoError::NotPermitted, 1);
        check(IoError::ShuttingDown, 108);
    }
}
