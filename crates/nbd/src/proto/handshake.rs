//! The handshake: greeting, client flags, options and option replies.

use super::*;

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
