//! The client's handshake: greeting, STARTTLS, options (structured replies, GO, with the old
//! EXPORT_NAME as a fallback), and TCP connects bounded in time.

use super::{bad_reply, ClientConfig, ClientError, ExportInfo};
use crate::proto::{self, ClientFlags, Info, InfoRequest};
use crate::socket::Socket;
use crate::tls::{PskKeys, TlsClient, TlsLink};
use crate::uri::UriTls;
use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;

/// Connects to the first address of `host` that answers within `timeout`. The connection is
/// aborted when closed (SO_LINGER 0: RST, and what the kernel still holds to send is dropped),
/// so a request of a connection given up on is never delivered late, after a reconnection.
pub(super) fn tcp_connect_within(host: &str, port: u16, timeout: std::time::Duration) -> io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last_error = io::Error::new(io::ErrorKind::NotFound, format!("{host} resolves to no address"));
    for address in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&address, timeout) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                abort_on_close(&stream)?;
                return Ok(stream);
            }
            Err(error) => last_error = io::Error::new(error.kind(), format!("{address}: {error}")),
        }
    }
    Err(last_error)
}

/// SO_LINGER with a zero timeout (std's `set_linger` is not stable).
fn abort_on_close(stream: &TcpStream) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    let size = std::mem::size_of::<libc::linger>() as libc::socklen_t;
    // SAFETY: setsockopt reads `size` bytes from a live `linger`; the descriptor is the stream's.
    let rc =
        unsafe { libc::setsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, (&linger as *const libc::linger).cast(), size) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the greeting and sends the client flags; whether the server omits the zero padding.
pub(super) fn greet(reader: &mut impl Read, writer: &mut impl Write) -> Result<bool, ClientError> {
    let mut greeting = [0u8; proto::GREETING_BYTES];
    reader.read_exact(&mut greeting)?;
    let handshake_flags = proto::parse_greeting(&greeting)?;
    let no_zeroes = handshake_flags & proto::NBD_FLAG_NO_ZEROES != 0;
    writer.write_all(&proto::encode_client_flags(ClientFlags { fixed_newstyle: true, no_zeroes }))?;
    Ok(no_zeroes)
}

/// NBD_OPT_STARTTLS first, as the spec advises a client that wants TLS, then the handshake.
pub(super) fn start_tls(
    reader: &mut BufReader<Socket>,
    writer: &mut impl Write,
    socket: &Socket,
    tls: &UriTls,
    timeout: std::time::Duration,
) -> Result<TlsLink, ClientError> {
    let keys = PskKeys::load(&tls.psk_file).map_err(|message| ClientError::Io(io::Error::other(message)))?;
    let client = TlsClient::psk(&keys, &tls.username).map_err(|message| ClientError::Io(io::Error::other(message)))?;
    send_option(writer, proto::NBD_OPT_STARTTLS, &[])?;
    let (header, data) = read_option_reply(reader, proto::NBD_OPT_STARTTLS)?;
    if header.reply_type != proto::NBD_REP_ACK {
        return Err(rejected(&header, &data));
    }
    if !reader.buffer().is_empty() {
        return Err(bad_reply("the server sent data after acknowledging STARTTLS".into()));
    }
    Ok(client.connect(socket, std::time::Instant::now() + timeout, timeout)?)
}

/// Options after the greeting (and TLS): structured replies if asked for, then the export.
pub(super) fn haggle(
    reader: &mut impl Read,
    writer: &mut impl Write,
    export_name: &str,
    no_zeroes: bool,
    config: &ClientConfig,
) -> Result<ExportInfo, ClientError> {
    let structured_replies = config.structured_replies && negotiate_structured_replies(reader, writer)?;
    let mut export = go(reader, writer, export_name, no_zeroes)?;
    export.structured_replies = structured_replies;
    Ok(export)
}

fn send_option(writer: &mut impl Write, option: u32, data: &[u8]) -> io::Result<()> {
    writer.write_all(&proto::encode_option(option, data))?;
    writer.flush()
}

fn read_option_reply(reader: &mut impl Read, option: u32) -> Result<(proto::OptionReplyHeader, Vec<u8>), ClientError> {
    let mut header_bytes = [0u8; proto::OPTION_REPLY_HEADER_BYTES];
    reader.read_exact(&mut header_bytes)?;
    let header = proto::parse_option_reply_header(&header_bytes)?;
    if header.option != option {
        return Err(bad_reply(format!("reply to option {} while waiting for {option}", header.option)));
    }
    let mut data = vec![0u8; header.len_bytes as usize];
    reader.read_exact(&mut data)?;
    Ok((header, data))
}

fn rejected(header: &proto::OptionReplyHeader, data: &[u8]) -> ClientError {
    ClientError::OptionRejected {
        option: header.option,
        reply_type: header.reply_type,
        message: String::from_utf8_lossy(data).into_owned(),
    }
}

fn negotiate_structured_replies(reader: &mut impl Read, writer: &mut impl Write) -> Result<bool, ClientError> {
    send_option(writer, proto::NBD_OPT_STRUCTURED_REPLY, &[])?;
    let (header, data) = read_option_reply(reader, proto::NBD_OPT_STRUCTURED_REPLY)?;
    match header.reply_type {
        proto::NBD_REP_ACK => Ok(true),
        proto::NBD_REP_ERR_UNSUP => Ok(false),
        _ => Err(rejected(&header, &data)),
    }
}

/// NBD_OPT_GO, asking for block sizes, name and description; falls back to EXPORT_NAME only
/// for a server that does not know GO.
fn go(reader: &mut impl Read, writer: &mut impl Write, export_name: &str, no_zeroes: bool) -> Result<ExportInfo, ClientError> {
    let request = InfoRequest {
        export_name: export_name.to_string(),
        info_types: vec![proto::NBD_INFO_BLOCK_SIZE, proto::NBD_INFO_NAME, proto::NBD_INFO_DESCRIPTION],
    };
    send_option(writer, proto::NBD_OPT_GO, &proto::encode_info_request(&request))?;
    let mut export = ExportInfo {
        export_name: export_name.to_string(),
        size_bytes: 0,
        transmission_flags: 0,
        block_sizes: None,
        description: None,
        structured_replies: false,
    };
    let mut got_export_info = false;
    loop {
        let (header, data) = read_option_reply(reader, proto::NBD_OPT_GO)?;
        match header.reply_type {
            proto::NBD_REP_INFO => got_export_info |= record_info(&mut export, proto::parse_rep_info(&data)?),
            proto::NBD_REP_ACK if got_export_info => return Ok(export),
            proto::NBD_REP_ACK => return Err(bad_reply("GO succeeded without NBD_INFO_EXPORT".into())),
            proto::NBD_REP_ERR_UNSUP => return export_name_fallback(reader, writer, export, no_zeroes),
            _ => return Err(rejected(&header, &data)),
        }
    }
}

/// Returns whether `info` was the mandatory NBD_INFO_EXPORT.
fn record_info(export: &mut ExportInfo, info: Info) -> bool {
    match info {
        Info::Export { size_bytes, transmission_flags } => {
            export.size_bytes = size_bytes;
            export.transmission_flags = transmission_flags;
            return true;
        }
        Info::Name(name) => export.export_name = name,
        Info::Description(description) => export.description = Some(description),
        Info::BlockSize(sizes) => export.block_sizes = Some(sizes),
        Info::Unknown { .. } => {}
    }
    false
}

fn export_name_fallback(
    reader: &mut impl Read,
    writer: &mut impl Write,
    mut export: ExportInfo,
    no_zeroes: bool,
) -> Result<ExportInfo, ClientError> {
    send_option(writer, proto::NBD_OPT_EXPORT_NAME, export.export_name.as_bytes())?;
    let mut reply = [0u8; proto::EXPORT_NAME_REPLY_BYTES + proto::EXPORT_NAME_REPLY_ZEROES_BYTES];
    let reply_bytes = if no_zeroes { proto::EXPORT_NAME_REPLY_BYTES } else { reply.len() };
    reader.read_exact(&mut reply[..reply_bytes])?;
    export.size_bytes = u64::from_be_bytes(reply[..8].try_into().expect("8 bytes"));
    export.transmission_flags = u16::from_be_bytes(reply[8..10].try_into().expect("2 bytes"));
    Ok(export)
}
