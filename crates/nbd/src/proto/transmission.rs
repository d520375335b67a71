//! Transmission: requests, and simple and structured replies.

use super::*;

// ---- Transmission: requests ------------------------------------------------------------------

/// The request types this implementation serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    WriteZeroes,
}

impl Command {
    pub fn from_code(code: u16) -> Option<Command> {
        match code {
            NBD_CMD_READ => Some(Command::Read),
            NBD_CMD_WRITE => Some(Command::Write),
            NBD_CMD_DISC => Some(Command::Disc),
            NBD_CMD_FLUSH => Some(Command::Flush),
            NBD_CMD_TRIM => Some(Command::Trim),
            NBD_CMD_WRITE_ZEROES => Some(Command::WriteZeroes),
            _ => None,
        }
    }

    pub fn code(self) -> u16 {
        match self {
            Command::Read => NBD_CMD_READ,
            Command::Write => NBD_CMD_WRITE,
            Command::Disc => NBD_CMD_DISC,
            Command::Flush => NBD_CMD_FLUSH,
            Command::Trim => NBD_CMD_TRIM,
            Command::WriteZeroes => NBD_CMD_WRITE_ZEROES,
        }
    }
}

/// One transmission request header. A WRITE is followed by `len_bytes` of payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// NBD_CMD_FLAG_* bits, as sent; the server validates them per command.
    pub flags: u16,
    pub command: Command,
    /// The client's opaque handle, echoed in every reply.
    pub cookie: u64,
    pub offset: u64,
    pub len_bytes: u32,
}

impl Request {
    pub fn has_flag(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

pub fn encode_request(request: &Request) -> [u8; REQUEST_HEADER_BYTES] {
    encode_raw_request(request.flags, request.command.code(), request.cookie, request.offset, request.len_bytes)
}

/// A request header with any type code, for tests that send what a hostile client would.
pub fn encode_raw_request(flags: u16, command_code: u16, cookie: u64, offset: u64, len_bytes: u32) -> [u8; REQUEST_HEADER_BYTES] {
    let mut out = [0u8; REQUEST_HEADER_BYTES];
    out[0..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&command_code.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..24].copy_from_slice(&offset.to_be_bytes());
    out[24..28].copy_from_slice(&len_bytes.to_be_bytes());
    out
}

/// Parses a request header. An unknown type is `UnknownCommand` carrying the cookie, so the
/// server can answer NBD_EINVAL (as the spec asks) and keep the connection.
pub fn parse_request(bytes: &[u8]) -> Result<Request, ProtoError> {
    let mut cursor = Cursor::new("request header", bytes, REQUEST_HEADER_BYTES)?;
    let magic = cursor.u32()?;
    expect_magic("request", u64::from(NBD_REQUEST_MAGIC), u64::from(magic))?;
    let flags = cursor.u16()?;
    let code = cursor.u16()?;
    let cookie = cursor.u64()?;
    let offset = cursor.u64()?;
    let len_bytes = cursor.u32()?;
    let command = Command::from_code(code).ok_or(ProtoError::UnknownCommand { cookie, command: code })?;
    Ok(Request { flags, command, cookie, offset, len_bytes })
}

// ---- Transmission: replies -------------------------------------------------------------------

/// A simple reply header; for a successful READ the data follows.
pub fn encode_simple_reply(cookie: u64, error: u32) -> [u8; SIMPLE_REPLY_HEADER_BYTES] {
    let mut out = [0u8; SIMPLE_REPLY_HEADER_BYTES];
    out[0..4].copy_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// The header of one structured reply chunk; `payload_len_bytes` of payload follow.
pub fn encode_chunk_header(flags: u16, chunk_type: u16, cookie: u64, payload_len_bytes: u32) -> [u8; STRUCTURED_REPLY_HEADER_BYTES] {
    let mut out = [0u8; STRUCTURED_REPLY_HEADER_BYTES];
    out[0..4].copy_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&chunk_type.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&payload_len_bytes.to_be_bytes());
    out
}

/// NBD_REPLY_TYPE_NONE with DONE: success of a command without data.
pub fn encode_none_chunk(cookie: u64) -> [u8; STRUCTURED_REPLY_HEADER_BYTES] {
    encode_chunk_header(NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, cookie, 0)
}

/// The header and offset of an NBD_REPLY_TYPE_OFFSET_DATA chunk; `data_len_bytes` of data follow.
/// `data_len_bytes` must be 1..=u32::MAX-8 (the spec's content chunks describe at least one byte).
pub fn encode_offset_data_header(cookie: u64, offset: u64, data_len_bytes: u32, done: bool) -> [u8; OFFSET_DATA_HEADER_BYTES] {
    assert!(data_len_bytes > 0, "an OFFSET_DATA chunk describes at least one byte");
    let payload_len_bytes = data_len_bytes.checked_add(8).expect("chunk data fits in u32 - 8");
    let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
    let mut out = [0u8; OFFSET_DATA_HEADER_BYTES];
    out[..STRUCTURED_REPLY_HEADER_BYTES].copy_from_slice(&encode_chunk_header(
        flags,
        NBD_REPLY_TYPE_OFFSET_DATA,
        cookie,
        payload_len_bytes,
    ));
    out[STRUCTURED_REPLY_HEADER_BYTES..].copy_from_slice(&offset.to_be_bytes());
    out
}

/// A final NBD_REPLY_TYPE_ERROR chunk with a message for a person (truncated to the spec's
/// string limit on a character boundary).
pub fn encode_error_chunk(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    assert!(error != 0, "an error chunk carries a nonzero error");
    let message = truncate_utf8(message, STRING_MAX_BYTES);
    let payload_len_bytes = u32::try_from(6 + message.len()).expect("message is short");
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + 6 + message.len());
    out.extend_from_slice(&encode_chunk_header(NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, cookie, payload_len_bytes));
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&u16::try_from(message.len()).expect("message is short").to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    out
}

fn truncate_utf8(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Client side: a reply header of either kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple { error: u32, cookie: u64 },
    Chunk { flags: u16, chunk_type: u16, cookie: u64, payload_len_bytes: u32 },
}

/// Client side: how many header bytes follow a reply's 4-byte magic.
pub fn reply_header_bytes(magic_bytes: &[u8]) -> Result<usize, ProtoError> {
    let magic = Cursor::new("reply magic", magic_bytes, 4)?.u32()?;
    match magic {
        NBD_SIMPLE_REPLY_MAGIC => Ok(SIMPLE_REPLY_HEADER_BYTES),
        NBD_STRUCTURED_REPLY_MAGIC => Ok(STRUCTURED_REPLY_HEADER_BYTES),
        _ => Err(ProtoError::BadMagic { what: "reply", expected: u64::from(NBD_SIMPLE_REPLY_MAGIC), got: u64::from(magic) }),
    }
}

/// Client side: parses a whole reply header (simple: 16 bytes; structured: 20 bytes).
pub fn parse_reply_header(bytes: &[u8]) -> Result<ReplyHeader, ProtoError> {
    let header_bytes = reply_header_bytes(bytes)?;
    let mut cursor = Cursor::new("reply header", bytes, header_bytes)?;
    let magic = cursor.u32()?;
    if magic == NBD_SIMPLE_REPLY_MAGIC {
        return Ok(ReplyHeader::Simple { error: cursor.u32()?, cookie: cursor.u64()? });
    }
    Ok(ReplyHeader::Chunk { flags: cursor.u16()?, chunk_type: cursor.u16()?, cookie: cursor.u64()?, payload_len_bytes: cursor.u32()? })
}

/// Client side: the fields of an error chunk payload (ERROR or ERROR_OFFSET).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorChunk {
    pub error: u32,
    pub message: String,
    /// Only for NBD_REPLY_TYPE_ERROR_OFFSET.
    pub offset: Option<u64>,
}

pub fn parse_error_chunk(chunk_type: u16, payload: &[u8]) -> Result<ErrorChunk, ProtoError> {
    let mut cursor = Cursor::new("error chunk", payload, 6)?;
    let error = cursor.u32()?;
    let message_len_bytes = cursor.u16()? as usize;
    let message = String::from_utf8_lossy(cursor.take(message_len_bytes)?).into_owned();
    let offset = match chunk_type {
        NBD_REPLY_TYPE_ERROR_OFFSET => Some(cursor.u64()?),
        _ => None,
    };
    Ok(ErrorChunk { error, message, offset })
}
