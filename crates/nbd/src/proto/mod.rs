//! The NBD wire format: constants, and pure parse/encode functions for the fixed newstyle
//! handshake, options, option replies, transmission requests and simple and structured replies.
//!
//! No I/O happens here: callers read exactly the number of bytes a `*_BYTES` constant names and
//! hand the slice in. Every parse function checks the length first and returns
//! [`ProtoError::Short`] rather than panicking, so that hostile input can never crash the server.
//!
//! All integers are big-endian (network byte order), as the spec requires. Names follow the
//! spec (`doc/proto.md` of the NetworkBlockDevice/nbd repository) so that they can be grepped.
//!
//! This module holds the constants, the errors and the bounds-checked reader; `handshake` the
//! greeting, options and option replies; `transmission` the requests and replies.

use std::fmt;

// ---- Magic numbers -------------------------------------------------------------------------

/// "NBDMAGIC", first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": the newstyle greeting's second magic, and the magic of every client option.
pub const NBD_OPTS_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply in fixed newstyle negotiation.
pub const NBD_REP_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---- Handshake flags (server, 16 bits) and client flags (32 bits) ---------------------------

pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;
/// The handshake flags this implementation's server sends.
pub const SERVER_HANDSHAKE_FLAGS: u16 = NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES;

// ---- Transmission flags (16 bits) ----------------------------------------------------------

pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const NBD_FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---- Options ---------------------------------------------------------------------------------

pub const NBD_OPT_EXPORT_NAME: u32 = 1;
pub const NBD_OPT_ABORT: u32 = 2;
pub const NBD_OPT_LIST: u32 = 3;
pub const NBD_OPT_PEEK_EXPORT: u32 = 4;
pub const NBD_OPT_STARTTLS: u32 = 5;
pub const NBD_OPT_INFO: u32 = 6;
pub const NBD_OPT_GO: u32 = 7;
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

// ---- Option reply types ----------------------------------------------------------------------

pub const NBD_REP_ACK: u32 = 1;
pub const NBD_REP_SERVER: u32 = 2;
pub const NBD_REP_INFO: u32 = 3;
pub const NBD_REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks every error reply type.
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR | 4;
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR | 5;
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR | 7;
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR | 8;
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR | 9;

// ---- Information types (NBD_OPT_INFO / NBD_OPT_GO) ------------------------------------------

pub const NBD_INFO_EXPORT: u16 = 0;
pub const NBD_INFO_NAME: u16 = 1;
pub const NBD_INFO_DESCRIPTION: u16 = 2;
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// ---- Commands and command flags --------------------------------------------------------------

pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_CACHE: u16 = 5;
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;

pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ---- Structured replies ----------------------------------------------------------------------

pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Bit 15 marks every error chunk type.
pub const NBD_REPLY_TYPE_ERROR_BIT: u16 = 1 << 15;
pub const NBD_REPLY_TYPE_ERROR: u16 = NBD_REPLY_TYPE_ERROR_BIT | 1;
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = NBD_REPLY_TYPE_ERROR_BIT | 2;

// ---- Error values (the reply's error field; not the host's errno) ----------------------------

pub const NBD_EPERM: u32 = 1;
pub const NBD_EIO: u32 = 5;
pub const NBD_ENOMEM: u32 = 12;
pub const NBD_EINVAL: u32 = 22;
pub const NBD_ENOSPC: u32 = 28;
pub const NBD_EOVERFLOW: u32 = 75;
pub const NBD_ENOTSUP: u32 = 95;
pub const NBD_ESHUTDOWN: u32 = 108;

/// The spec's name of an error value, for messages; "unknown" for values it does not define.
pub fn error_name(error: u32) -> &'static str {
    match error {
        NBD_EPERM => "EPERM",
        NBD_EIO => "EIO",
        NBD_ENOMEM => "ENOMEM",
        NBD_EINVAL => "EINVAL",
        NBD_ENOSPC => "ENOSPC",
        NBD_EOVERFLOW => "EOVERFLOW",
        NBD_ENOTSUP => "ENOTSUP",
        NBD_ESHUTDOWN => "ESHUTDOWN",
        _ => "unknown error",
    }
}

// ---- Sizes and limits ------------------------------------------------------------------------

/// NBDMAGIC + IHAVEOPT + 16-bit handshake flags.
pub const GREETING_BYTES: usize = 18;
pub const CLIENT_FLAGS_BYTES: usize = 4;
/// IHAVEOPT + 32-bit option + 32-bit data length.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Reply magic + option + reply type + data length.
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
/// Size, transmission flags and 124 reserved zero bytes (unless NO_ZEROES) after EXPORT_NAME.
pub const EXPORT_NAME_REPLY_BYTES: usize = 8 + 2;
pub const EXPORT_NAME_REPLY_ZEROES_BYTES: usize = 124;
pub const REQUEST_HEADER_BYTES: usize = 28;
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;
pub const STRUCTURED_REPLY_HEADER_BYTES: usize = 20;
/// Chunk header plus the 64-bit offset that starts an OFFSET_DATA payload.
pub const OFFSET_DATA_HEADER_BYTES: usize = STRUCTURED_REPLY_HEADER_BYTES + 8;
/// Strings (export names, descriptions, messages) MUST be no longer than this.
pub const STRING_MAX_BYTES: usize = 4096;
/// Largest option data accepted: a GO with a maximal name and a generous list of info requests.
/// Anything larger is treated as hostile (the spec allows a hard disconnect for denial of service).
pub const OPTION_DATA_MAX_BYTES: u32 = (STRING_MAX_BYTES + 1024) as u32;
/// The minimum block size storc advertises unless the device's is larger.
pub const BLOCK_SIZE_MIN_BYTES: u32 = 512;
/// The preferred block size advertised unless the device's block size is larger.
pub const BLOCK_SIZE_PREFERRED_BYTES: u32 = 4096;
/// The maximum request payload advertised: 2^25, the largest length the spec says clients may
/// always use. Writes longer than this are treated as a denial of service (hard disconnect).
pub const PAYLOAD_MAX_BYTES: u32 = 32 * 1024 * 1024;
/// The spec's largest allowed minimum block size.
pub const BLOCK_SIZE_MIN_LIMIT_BYTES: u32 = 64 * 1024;
/// The IANA port for NBD.
pub const NBD_DEFAULT_PORT: u16 = 10809;

// ---- Errors ----------------------------------------------------------------------------------

/// Why bytes could not be parsed. Each variant carries what was expected and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// Fewer bytes than the structure needs.
    Short { what: &'static str, needed_bytes: usize, got_bytes: usize },
    /// A magic number did not match.
    BadMagic { what: &'static str, expected: u64, got: u64 },
    /// The client set flags the server did not offer (the spec says: drop the connection).
    UnknownClientFlags { flags: u32 },
    /// The server does not speak fixed newstyle.
    NotFixedNewstyle { handshake_flags: u16 },
    /// An option announced more data than any valid option needs.
    OptionTooLong { option: u32, len_bytes: u32, max_bytes: u32 },
    /// A known option with data that does not follow its format.
    InvalidOption { option: u32, reason: String },
    /// A request type this implementation does not serve; the cookie lets the server reply.
    UnknownCommand { cookie: u64, command: u16 },
    /// A reply the client cannot make sense of.
    BadReply { reason: String },
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::Short { what, needed_bytes, got_bytes } => {
                write!(f, "{what} needs {needed_bytes} bytes, got {got_bytes}")
            }
            ProtoError::BadMagic { what, expected, got } => {
                write!(f, "bad {what} magic {got:#x}, expected {expected:#x}")
            }
            ProtoError::UnknownClientFlags { flags } => write!(
                f,
                "client flags {flags:#x} include bits the server did not offer \
                 (allowed: FIXED_NEWSTYLE {NBD_FLAG_C_FIXED_NEWSTYLE:#x}, NO_ZEROES {NBD_FLAG_C_NO_ZEROES:#x})"
            ),
            ProtoError::NotFixedNewstyle { handshake_flags } => {
                write!(f, "server handshake flags {handshake_flags:#x} lack FIXED_NEWSTYLE; only fixed newstyle is supported")
            }
            ProtoError::OptionTooLong { option, len_bytes, max_bytes } => {
                write!(f, "option {option} announces {len_bytes} bytes of data, at most {max_bytes} allowed")
            }
            ProtoError::InvalidOption { option, reason } => {
                write!(f, "invalid data for option {option}: {reason}")
            }
            ProtoError::UnknownCommand { cookie, command } => {
                write!(f, "unknown command type {command} (cookie {cookie:#x}); allowed: READ, WRITE, DISC, FLUSH, TRIM, WRITE_ZEROES")
            }
            ProtoError::BadReply { reason } => write!(f, "malformed reply: {reason}"),
        }
    }
}

impl std::error::Error for ProtoError {}

// ---- A bounds-checked big-endian reader ------------------------------------------------------

/// Reads big-endian fields from a slice; every read checks the length so parsing never panics.
struct Cursor<'a> {
    what: &'static str,
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Cursor<'a> {
    /// Starts parsing `what`, which must be at least `needed_bytes` long.
    fn new(what: &'static str, bytes: &'a [u8], needed_bytes: usize) -> Result<Self, ProtoError> {
        if bytes.len() < needed_bytes {
            return Err(ProtoError::Short { what, needed_bytes, got_bytes: bytes.len() });
        }
        Ok(Cursor { what, bytes, position: 0 })
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], ProtoError> {
        let end = self.position.checked_add(len).filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            return Err(ProtoError::Short {
                what: self.what,
                needed_bytes: self.position.saturating_add(len),
                got_bytes: self.bytes.len(),
            });
        };
        let field = &self.bytes[self.position..end];
        self.position = end;
        Ok(field)
    }

    fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("took 2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("took 4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("took 8 bytes")))
    }

    fn rest(&mut self) -> &'a [u8] {
        let rest = &self.bytes[self.position..];
        self.position = self.bytes.len();
        rest
    }

    fn remaining_bytes(&self) -> usize {
        self.bytes.len() - self.position
    }
}

fn expect_magic(what: &'static str, expected: u64, got: u64) -> Result<(), ProtoError> {
    if got != expected {
        return Err(ProtoError::BadMagic { what, expected, got });
    }
    Ok(())
}

fn utf8_string(option: u32, what: &str, bytes: &[u8]) -> Result<String, ProtoError> {
    if bytes.len() > STRING_MAX_BYTES {
        let reason = format!("{what} is {} bytes, at most {STRING_MAX_BYTES} allowed", bytes.len());
        return Err(ProtoError::InvalidOption { option, reason });
    }
    String::from_utf8(bytes.to_vec()).map_err(|_| ProtoError::InvalidOption { option, reason: format!("{what} is not UTF-8") })
}

mod handshake;
mod transmission;

pub use handshake::*;
pub use transmission::*;

#[cfg(test)]
mod tests;
