//! The NBD wire format: constants, and pure parse/encode functions for the fixed newstyle
//! handshake, options, option replies, transmission requests and simple and structured replies.
//!
//! No I/O happens here: callers read exactly the number of bytes a `*_BYTES` constant names and
//! hand the slice in. Every parse function checks the length first and returns
//! [`ProtoError::Short`] rather than panicking, so that hostile input can never crash the server.
//!
//! All integers are big-endian (network byte order), as the spec requires. Names follow the
//! spec (`doc/proto.md` of the NetworkBlockDevice/nbd repository) so that they can be grepped.

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

// ---- Handshake -------------------------------------------------------------------------------

/// The server's first message: NBDMAGIC, IHAVEOPT, handshake flags.
pub fn encode_greeting(handshake_flags: u16) -> [u8; GREETING_BYTES] {
    let mut out = [0u8; GREETING_BYTES];
    out[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&NBD_OPTS_MAGIC.to_be_bytes());
    out[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    out
}

/// Client side: checks the greeting and returns the server's handshake flags.
pub fn parse_greeting(bytes: &[u8]) -> Result<u16, ProtoError> {
    let mut cursor = Cursor::new("greeting", bytes, GREETING_BYTES)?;
    expect_magic("greeting NBDMAGIC", NBD_MAGIC, cursor.u64()?)?;
    expect_magic("greeting IHAVEOPT", NBD_OPTS_MAGIC, cursor.u64()?)?;
    let handshake_flags = cursor.u16()?;
    if handshake_flags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
        return Err(ProtoError::NotFixedNewstyle { handshake_flags });
    }
    Ok(handshake_flags)
}

/// What the client answered to the greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

pub fn encode_client_flags(flags: ClientFlags) -> [u8; CLIENT_FLAGS_BYTES] {
    let mut bits = 0;
    if flags.fixed_newstyle {
        bits |= NBD_FLAG_C_FIXED_NEWSTYLE;
    }
    if flags.no_zeroes {
        bits |= NBD_FLAG_C_NO_ZEROES;
    }
    bits.to_be_bytes()
}

/// Server side: parses the client flags; flags the server did not offer are an error
/// (the spec says the server MUST drop the connection).
pub fn parse_client_flags(bytes: &[u8], offered: u16) -> Result<ClientFlags, ProtoError> {
    let flags = Cursor::new("client flags", bytes, CLIENT_FLAGS_BYTES)?.u32()?;
    let allowed = u32::from(offered) & (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    if flags & !allowed != 0 {
        return Err(ProtoError::UnknownClientFlags { flags });
    }
    Ok(ClientFlags { fixed_newstyle: flags & NBD_FLAG_C_FIXED_NEWSTYLE != 0, no_zeroes: flags & NBD_FLAG_C_NO_ZEROES != 0 })
}

// ---- Options ---------------------------------------------------------------------------------

/// The fixed-size part of a client option; `len_bytes` of data follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len_bytes: u32,
}

/// Parses an option header, rejecting data lengths no valid option needs, before the server
/// commits memory to reading them.
pub fn parse_option_header(bytes: &[u8]) -> Result<OptionHeader, ProtoError> {
    let mut cursor = Cursor::new("option header", bytes, OPTION_HEADER_BYTES)?;
    expect_magic("option IHAVEOPT", NBD_OPTS_MAGIC, cursor.u64()?)?;
    let option = cursor.u32()?;
    let len_bytes = cursor.u32()?;
    if len_bytes > OPTION_DATA_MAX_BYTES {
        return Err(ProtoError::OptionTooLong { option, len_bytes, max_bytes: OPTION_DATA_MAX_BYTES });
    }
    Ok(OptionHeader { option, len_bytes })
}

/// Client side: the header and data of one option.
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let len_bytes = u32::try_from(data.len()).expect("option data fits in u32");
    let mut out = Vec::with_capacity(OPTION_HEADER_BYTES + data.len());
    out.extend_from_slice(&NBD_OPTS_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&len_bytes.to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// The data of NBD_OPT_INFO and NBD_OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub export_name: String,
    /// NBD_INFO_* types the client asked for, in the order asked.
    pub info_types: Vec<u16>,
}

impl InfoRequest {
    pub fn asks_for(&self, info_type: u16) -> bool {
        self.info_types.contains(&info_type)
    }
}

/// An option the server understands, or the number of one it does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    ExportName {
        export_name: String,
    },
    Abort,
    List,
    Info(InfoRequest),
    Go(InfoRequest),
    StructuredReply,
    /// NBD_OPT_STARTTLS: the TLS handshake follows the server's ACK.
    StartTls,
    /// Any other option: the server answers NBD_REP_ERR_UNSUP and goes on.
    Unsupported {
        option: u32,
    },
}

/// Parses an option's data. Data that breaks a known option's format is `InvalidOption`
/// (the server answers NBD_REP_ERR_INVALID).
pub fn parse_option(option: u32, data: &[u8]) -> Result<ClientOption, ProtoError> {
    match option {
        NBD_OPT_EXPORT_NAME => Ok(ClientOption::ExportName { export_name: utf8_string(option, "export name", data)? }),
        // The spec: a server SHOULD ignore data sent with ABORT.
        NBD_OPT_ABORT => Ok(ClientOption::Abort),
        NBD_OPT_LIST => expect_no_data(option, data).map(|()| ClientOption::List),
        NBD_OPT_STRUCTURED_REPLY => expect_no_data(option, data).map(|()| ClientOption::StructuredReply),
        NBD_OPT_STARTTLS => expect_no_data(option, data).map(|()| ClientOption::StartTls),
        NBD_OPT_INFO => parse_info_request(option, data).map(ClientOption::Info),
        NBD_OPT_GO => parse_info_request(option, data).map(ClientOption::Go),
        _ => Ok(ClientOption::Unsupported { option }),
    }
}

fn expect_no_data(option: u32, data: &[u8]) -> Result<(), ProtoError> {
    if !data.is_empty() {
        let reason = format!("expected no data, got {} bytes", data.len());
        return Err(ProtoError::InvalidOption { option, reason });
    }
    Ok(())
}

fn parse_info_request(option: u32, data: &[u8]) -> Result<InfoRequest, ProtoError> {
    let invalid = |reason: String| ProtoError::InvalidOption { option, reason };
    let mut cursor = Cursor::new("info request", data, 4 + 2).map_err(|e| invalid(e.to_string()))?;
    let name_len_bytes = cursor.u32().map_err(|e| invalid(e.to_string()))? as usize;
    // The spec: the name length MUST be no larger than the option data length - 6.
    if name_len_bytes > data.len() - 6 {
        return Err(invalid(format!("export name length {name_len_bytes} exceeds option data length {} - 6", data.len())));
    }
    let name = cursor.take(name_len_bytes).map_err(|e| invalid(e.to_string()))?;
    let export_name = utf8_string(option, "export name", name)?;
    let count = cursor.u16().map_err(|e| invalid(e.to_string()))? as usize;
    if cursor.remaining_bytes() != count * 2 {
        return Err(invalid(format!("{count} information requests need {} bytes, {} present", count * 2, cursor.remaining_bytes())));
    }
    let info_types = (0..count).map(|_| cursor.u16().expect("length checked")).collect();
    Ok(InfoRequest { export_name, info_types })
}

/// Client side: the data of NBD_OPT_INFO / NBD_OPT_GO.
pub fn encode_info_request(request: &InfoRequest) -> Vec<u8> {
    let name = request.export_name.as_bytes();
    let mut out = Vec::with_capacity(4 + name.len() + 2 + 2 * request.info_types.len());
    out.extend_from_slice(&u32::try_from(name.len()).expect("name fits").to_be_bytes());
    out.extend_from_slice(name);
    let count = u16::try_from(request.info_types.len()).expect("few info requests");
    out.extend_from_slice(&count.to_be_bytes());
    for info_type in &request.info_types {
        out.extend_from_slice(&info_type.to_be_bytes());
    }
    out
}

// ---- Option replies --------------------------------------------------------------------------

/// One option reply: header plus data.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let len_bytes = u32::try_from(data.len()).expect("reply data fits in u32");
    let mut out = Vec::with_capacity(OPTION_REPLY_HEADER_BYTES + data.len());
    out.extend_from_slice(&NBD_REP_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&len_bytes.to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// NBD_REP_SERVER for NBD_OPT_LIST: the name, then an optional human-readable description.
pub fn encode_rep_server(export_name: &str, description: Option<&str>) -> Vec<u8> {
    let name = export_name.as_bytes();
    let mut data = Vec::with_capacity(4 + name.len());
    data.extend_from_slice(&u32::try_from(name.len()).expect("name fits").to_be_bytes());
    data.extend_from_slice(name);
    data.extend_from_slice(description.unwrap_or("").as_bytes());
    encode_option_reply(NBD_OPT_LIST, NBD_REP_SERVER, &data)
}

/// The block size constraints of an export (see "Block size constraints" in the spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    pub min_bytes: u32,
    pub preferred_bytes: u32,
    pub max_bytes: u32,
}

/// One NBD_REP_INFO payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    Export {
        size_bytes: u64,
        transmission_flags: u16,
    },
    Name(String),
    Description(String),
    BlockSize(BlockSizes),
    /// An information type this implementation does not know; clients MUST ignore it.
    Unknown {
        info_type: u16,
    },
}

/// NBD_REP_INFO for the given option (INFO or GO).
pub fn encode_rep_info(option: u32, info: &Info) -> Vec<u8> {
    let mut data = Vec::with_capacity(14);
    match info {
        Info::Export { size_bytes, transmission_flags } => {
            data.extend_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
            data.extend_from_slice(&size_bytes.to_be_bytes());
            data.extend_from_slice(&transmission_flags.to_be_bytes());
        }
        Info::Name(name) => {
            data.extend_from_slice(&NBD_INFO_NAME.to_be_bytes());
            data.extend_from_slice(name.as_bytes());
        }
        Info::Description(description) => {
            data.extend_from_slice(&NBD_INFO_DESCRIPTION.to_be_bytes());
            data.extend_from_slice(description.as_bytes());
        }
        Info::BlockSize(sizes) => {
            data.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
            data.extend_from_slice(&sizes.min_bytes.to_be_bytes());
            data.extend_from_slice(&sizes.preferred_bytes.to_be_bytes());
            data.extend_from_slice(&sizes.max_bytes.to_be_bytes());
        }
        Info::Unknown { info_type } => data.extend_from_slice(&info_type.to_be_bytes()),
    }
    encode_option_reply(option, NBD_REP_INFO, &data)
}

/// Client side: parses an NBD_REP_INFO payload.
pub fn parse_rep_info(data: &[u8]) -> Result<Info, ProtoError> {
    let bad = |reason: String| ProtoError::BadReply { reason };
    let mut cursor = Cursor::new("info reply", data, 2)?;
    let info_type = cursor.u16()?;
    let expect_len = |len: usize| {
        if data.len() != len {
            return Err(bad(format!("info type {info_type} must be {len} bytes, got {}", data.len())));
        }
        Ok(())
    };
    match info_type {
        NBD_INFO_EXPORT => {
            expect_len(12)?;
            Ok(Info::Export { size_bytes: cursor.u64()?, transmission_flags: cursor.u16()? })
        }
        NBD_INFO_BLOCK_SIZE => {
            expect_len(14)?;
            let sizes = BlockSizes { min_bytes: cursor.u32()?, preferred_bytes: cursor.u32()?, max_bytes: cursor.u32()? };
            Ok(Info::BlockSize(sizes))
        }
        NBD_INFO_NAME | NBD_INFO_DESCRIPTION => {
            let text = String::from_utf8_lossy(cursor.rest()).into_owned();
            Ok(if info_type == NBD_INFO_NAME { Info::Name(text) } else { Info::Description(text) })
        }
        _ => Ok(Info::Unknown { info_type }),
    }
}

/// Client side: the header of one option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub len_bytes: u32,
}

impl OptionReplyHeader {
    pub fn is_error(&self) -> bool {
        self.reply_type & NBD_REP_FLAG_ERROR != 0
    }
}

/// Client side: parses an option reply header; replies longer than a string plus slack are refused.
pub fn parse_option_reply_header(bytes: &[u8]) -> Result<OptionReplyHeader, ProtoError> {
    let mut cursor = Cursor::new("option reply header", bytes, OPTION_REPLY_HEADER_BYTES)?;
    expect_magic("option reply", NBD_REP_MAGIC, cursor.u64()?)?;
    let header = OptionReplyHeader { option: cursor.u32()?, reply_type: cursor.u32()?, len_bytes: cursor.u32()? };
    if header.len_bytes > OPTION_DATA_MAX_BYTES {
        let reason = format!("option reply announces {} bytes, at most {OPTION_DATA_MAX_BYTES} allowed", header.len_bytes);
        return Err(ProtoError::BadReply { reason });
    }
    Ok(header)
}

/// After NBD_OPT_EXPORT_NAME: export size, transmission flags, and 124 zeroes unless the client
/// negotiated NBD_FLAG_C_NO_ZEROES.
pub fn encode_export_name_reply(size_bytes: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(EXPORT_NAME_REPLY_BYTES + EXPORT_NAME_REPLY_ZEROES_BYTES);
    out.extend_from_slice(&size_bytes.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        out.resize(EXPORT_NAME_REPLY_BYTES + EXPORT_NAME_REPLY_ZEROES_BYTES, 0);
    }
    out
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Compares a parse result with what the test expects, printing both on mismatch.
    fn check<T: PartialEq + fmt::Debug>(actual: Result<T, ProtoError>, expected: Result<T, ProtoError>) {
        assert_eq!(actual, expected);
    }

    fn short(what: &'static str, needed_bytes: usize, got_bytes: usize) -> ProtoError {
        ProtoError::Short { what, needed_bytes, got_bytes }
    }

    #[test]
    fn greeting_round_trips_and_rejects_bad_input() {
        let greeting = encode_greeting(SERVER_HANDSHAKE_FLAGS);
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        assert_eq!(&greeting[8..16], b"IHAVEOPT");
        assert_eq!(&greeting[16..], &[0, 3]);
        check(parse_greeting(&greeting), Ok(3));
        check(parse_greeting(&greeting[..17]), Err(short("greeting", 18, 17)));
        let mut bad = greeting;
        bad[0] = b'X';
        check(
            parse_greeting(&bad),
            Err(ProtoError::BadMagic { what: "greeting NBDMAGIC", expected: NBD_MAGIC, got: 0x5842_444d_4147_4943 }),
        );
        check(parse_greeting(&encode_greeting(0)), Err(ProtoError::NotFixedNewstyle { handshake_flags: 0 }));
    }

    #[test]
    fn client_flags_accept_only_what_was_offered() {
        let both = ClientFlags { fixed_newstyle: true, no_zeroes: true };
        check(parse_client_flags(&[0, 0, 0, 3], SERVER_HANDSHAKE_FLAGS), Ok(both));
        check(parse_client_flags(&encode_client_flags(both), SERVER_HANDSHAKE_FLAGS), Ok(both));
        let none = ClientFlags { fixed_newstyle: false, no_zeroes: false };
        check(parse_client_flags(&[0, 0, 0, 0], SERVER_HANDSHAKE_FLAGS), Ok(none));
        check(parse_client_flags(&[0, 0, 0, 4], SERVER_HANDSHAKE_FLAGS), Err(ProtoError::UnknownClientFlags { flags: 4 }));
        // NO_ZEROES is an error when the server did not offer it.
        check(parse_client_flags(&[0, 0, 0, 3], NBD_FLAG_FIXED_NEWSTYLE), Err(ProtoError::UnknownClientFlags { flags: 3 }));
        check(parse_client_flags(&[0, 0, 3], SERVER_HANDSHAKE_FLAGS), Err(short("client flags", 4, 3)));
    }

    #[test]
    fn option_header_parses_and_rejects_oversized_lengths() {
        let go = encode_option(NBD_OPT_GO, &[0; 6]);
        check(parse_option_header(&go[..16]), Ok(OptionHeader { option: NBD_OPT_GO, len_bytes: 6 }));
        check(parse_option_header(&go[..15]), Err(short("option header", 16, 15)));
        let mut oversized = encode_option(NBD_OPT_GO, &[]);
        oversized[12..16].copy_from_slice(&0xffff_fff0u32.to_be_bytes());
        check(
            parse_option_header(&oversized),
            Err(ProtoError::OptionTooLong { option: NBD_OPT_GO, len_bytes: 0xffff_fff0, max_bytes: OPTION_DATA_MAX_BYTES }),
        );
        let mut bad_magic = go.clone();
        bad_magic[0] = 0;
        check(
            parse_option_header(&bad_magic),
            Err(ProtoError::BadMagic { what: "option IHAVEOPT", expected: NBD_OPTS_MAGIC, got: 0x0048_4156_454f_5054 }),
        );
    }

    #[test]
    fn options_parse_into_what_the_server_acts_on() {
        let request = InfoRequest { export_name: "vd0".into(), info_types: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME] };
        let data = encode_info_request(&request);
        assert_eq!(data, [0, 0, 0, 3, b'v', b'd', b'0', 0, 2, 0, 3, 0, 1]);
        check(parse_option(NBD_OPT_GO, &data), Ok(ClientOption::Go(request.clone())));
        check(parse_option(NBD_OPT_INFO, &data), Ok(ClientOption::Info(request)));
        check(parse_option(NBD_OPT_EXPORT_NAME, b"vd1"), Ok(ClientOption::ExportName { export_name: "vd1".into() }));
        check(parse_option(NBD_OPT_ABORT, b"ignored"), Ok(ClientOption::Abort));
        check(parse_option(NBD_OPT_LIST, &[]), Ok(ClientOption::List));
        check(parse_option(NBD_OPT_STRUCTURED_REPLY, &[]), Ok(ClientOption::StructuredReply));
        check(parse_option(NBD_OPT_STARTTLS, &[]), Ok(ClientOption::StartTls));
        check(
            parse_option(NBD_OPT_STARTTLS, &[0]),
            Err(ProtoError::InvalidOption { option: NBD_OPT_STARTTLS, reason: "expected no data, got 1 bytes".into() }),
        );
        check(parse_option(NBD_OPT_SET_META_CONTEXT, &[1, 2, 3]), Ok(ClientOption::Unsupported { option: NBD_OPT_SET_META_CONTEXT }));
    }

    #[test]
    fn malformed_options_are_invalid_not_panics() {
        let invalid = |option, reason: &str| Err(ProtoError::InvalidOption { option, reason: reason.into() });
        check(parse_option(NBD_OPT_LIST, &[0]), invalid(NBD_OPT_LIST, "expected no data, got 1 bytes"));
        check(parse_option(NBD_OPT_GO, &[0, 0, 0]), invalid(NBD_OPT_GO, "info request needs 6 bytes, got 3"));
        check(parse_option(NBD_OPT_GO, &[0, 0, 0, 9, 0, 0]), invalid(NBD_OPT_GO, "export name length 9 exceeds option data length 6 - 6"));
        check(parse_option(NBD_OPT_GO, &[0, 0, 0, 0, 0, 2, 0, 3]), invalid(NBD_OPT_GO, "2 information requests need 4 bytes, 2 present"));
        check(parse_option(NBD_OPT_GO, &[0, 0, 0, 1, 0xff, 0, 0]), invalid(NBD_OPT_GO, "export name is not UTF-8"));
    }

    #[test]
    fn option_replies_have_the_spec_layout() {
        let ack = encode_option_reply(NBD_OPT_GO, NBD_REP_ACK, &[]);
        assert_eq!(ack.len(), OPTION_REPLY_HEADER_BYTES);
        check(parse_option_reply_header(&ack), Ok(OptionReplyHeader { option: NBD_OPT_GO, reply_type: NBD_REP_ACK, len_bytes: 0 }));
        let server = encode_rep_server("a", Some("desc"));
        assert_eq!(&server[20..], &[0, 0, 0, 1, b'a', b'd', b'e', b's', b'c']);
        let export = Info::Export { size_bytes: 1 << 30, transmission_flags: 0x14d };
        let sizes = Info::BlockSize(BlockSizes { min_bytes: 512, preferred_bytes: 4096, max_bytes: 1 << 25 });
        for info in [export, sizes, Info::Name("vd0".into()), Info::Description("RAID 5".into())] {
            let reply = encode_rep_info(NBD_OPT_INFO, &info);
            let header = parse_option_reply_header(&reply).unwrap();
            assert_eq!(header.reply_type, NBD_REP_INFO);
            assert_eq!(header.len_bytes as usize, reply.len() - OPTION_REPLY_HEADER_BYTES);
            check(parse_rep_info(&reply[OPTION_REPLY_HEADER_BYTES..]), Ok(info));
        }
        check(parse_rep_info(&[0, 0, 1]), Err(ProtoError::BadReply { reason: "info type 0 must be 12 bytes, got 3".into() }));
        assert_eq!(NBD_REP_ERR_UNSUP, 0x8000_0001);
        assert_eq!(NBD_REP_ERR_UNKNOWN, 0x8000_0006);
    }

    #[test]
    fn export_name_reply_pads_unless_no_zeroes() {
        assert_eq!(encode_export_name_reply(4096, 1, true), [0, 0, 0, 0, 0, 0, 0x10, 0, 0, 1]);
        assert_eq!(encode_export_name_reply(4096, 1, false).len(), 134);
    }

    #[test]
    fn requests_parse_and_reject_bad_magic_short_and_unknown_types() {
        let write = Request { flags: NBD_CMD_FLAG_FUA, command: Command::Write, cookie: 7, offset: 4096, len_bytes: 512 };
        let bytes = encode_request(&write);
        assert_eq!(&bytes[..8], &[0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1]);
        check(parse_request(&bytes), Ok(write));
        check(parse_request(&bytes[..27]), Err(short("request header", 28, 27)));
        check(parse_request(&[]), Err(short("request header", 28, 0)));
        let mut bad_magic = bytes;
        bad_magic[3] = 0x14;
        check(parse_request(&bad_magic), Err(ProtoError::BadMagic { what: "request", expected: 0x2560_9513, got: 0x2560_9514 }));
        check(
            parse_request(&encode_raw_request(0, NBD_CMD_BLOCK_STATUS, 9, 0, 512)),
            Err(ProtoError::UnknownCommand { cookie: 9, command: NBD_CMD_BLOCK_STATUS }),
        );
        check(parse_request(&encode_raw_request(0, 0xffff, 10, 0, 0)), Err(ProtoError::UnknownCommand { cookie: 10, command: 0xffff }));
        for command in [Command::Read, Command::Write, Command::Disc, Command::Flush, Command::Trim, Command::WriteZeroes] {
            assert_eq!(Command::from_code(command.code()), Some(command));
        }
    }

    #[test]
    fn replies_round_trip() {
        let simple = encode_simple_reply(0xabcd, NBD_EINVAL);
        check(parse_reply_header(&simple), Ok(ReplyHeader::Simple { error: 22, cookie: 0xabcd }));
        let data = encode_offset_data_header(5, 1024, 512, true);
        check(parse_reply_header(&data), Ok(ReplyHeader::Chunk { flags: 1, chunk_type: 1, cookie: 5, payload_len_bytes: 520 }));
        assert_eq!(&data[20..], &1024u64.to_be_bytes());
        check(
            parse_reply_header(&encode_none_chunk(6)),
            Ok(ReplyHeader::Chunk { flags: 1, chunk_type: 0, cookie: 6, payload_len_bytes: 0 }),
        );
        let error = encode_error_chunk(8, NBD_ENOSPC, "past end");
        check(parse_reply_header(&error), Ok(ReplyHeader::Chunk { flags: 1, chunk_type: 0x8001, cookie: 8, payload_len_bytes: 14 }));
        check(
            parse_error_chunk(NBD_REPLY_TYPE_ERROR, &error[20..]),
            Ok(ErrorChunk { error: 28, message: "past end".into(), offset: None }),
        );
        check(parse_reply_header(&simple[..10]), Err(short("reply header", 16, 10)));
        check(parse_reply_header(&[1, 2, 3, 4]), Err(ProtoError::BadMagic { what: "reply", expected: 0x6744_6698, got: 0x0102_0304 }));
    }

    #[test]
    fn error_chunk_messages_are_cut_on_char_boundaries() {
        let long = "é".repeat(STRING_MAX_BYTES);
        let chunk = encode_error_chunk(1, NBD_EIO, &long);
        let parsed = parse_error_chunk(NBD_REPLY_TYPE_ERROR, &chunk[20..]).unwrap();
        assert_eq!(parsed.message.len(), STRING_MAX_BYTES);
        assert!(parsed.message.chars().all(|c| c == 'é'));
    }
}
