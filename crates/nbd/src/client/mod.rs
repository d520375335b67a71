//! A small blocking NBD client for storc's benchmark and tests: fixed newstyle, NBD_OPT_GO,
//! optional structured replies, and pipelined requests matched to replies by cookie.
//!
//! One thread drives a client: `submit_*` queue requests (sent on the next `wait`), `wait`
//! returns completions in the order the server sends them. A caller keeping N in flight should
//! keep N within the server's bound (storc: 128 requests, 64 MiB), since a server that stops
//! reading while this thread is blocked writing a large payload would wait on replies that
//! nobody reads.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;

mod handshake;

use crate::proto::{self, BlockSizes, Command, ProtoError, ReplyHeader, Request};
use crate::socket::Socket;
use crate::tls::TlsLink;
use crate::uri::{NbdUri, UriTls};
use handshake::{greet, haggle, start_tls, tcp_connect_within};

/// How long the TLS handshake may take, and sealed requests may wait for a server that reads
/// nothing, before the client gives up.
const TLS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Choices made during the handshake.
#[derive(Debug, Clone, Default)]
pub struct ClientConfig {
    /// Ask for structured replies (reads then arrive as chunks, errors with messages).
    pub structured_replies: bool,
}

/// What the server said about the export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub export_name: String,
    pub size_bytes: u64,
    pub transmission_flags: u16,
    /// `None` if the server sent no NBD_INFO_BLOCK_SIZE.
    pub block_sizes: Option<BlockSizes>,
    pub description: Option<String>,
    pub structured_replies: bool,
}

/// An error the server returned for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdError {
    /// The NBD error value (`proto::NBD_E*`).
    pub error: u32,
    /// The server's explanation; empty with simple replies.
    pub message: String,
}

impl fmt::Display for NbdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", proto::error_name(self.error), self.error)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for NbdError {}

/// Why the client could not go on.
#[derive(Debug)]
pub enum ClientError {
    Io(io::Error),
    Protocol(ProtoError),
    /// The server refused an option during the handshake (e.g. an unknown export).
    OptionRejected {
        option: u32,
        reply_type: u32,
        message: String,
    },
    /// A blocking call's request failed on the server.
    Server(NbdError),
    /// `wait` was called with no request in flight.
    NothingInFlight,
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Io(error) => write!(f, "NBD connection: {error}"),
            ClientError::Protocol(error) => write!(f, "NBD protocol: {error}"),
            ClientError::OptionRejected { option, reply_type, message } => {
                write!(f, "server refused option {option} with reply {reply_type:#x}: {message}")
            }
            ClientError::Server(error) => write!(f, "server error {error}"),
            ClientError::NothingInFlight => write!(f, "wait() called with no request in flight"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(error: io::Error) -> Self {
        ClientError::Io(error)
    }
}

impl From<ProtoError> for ClientError {
    fn from(error: ProtoError) -> Self {
        ClientError::Protocol(error)
    }
}

fn bad_reply(reason: String) -> ClientError {
    ClientError::Protocol(ProtoError::BadReply { reason })
}

/// A connection after its handshake, in pieces (`Client::into_parts`).
pub(crate) struct ClientParts {
    pub(crate) reader: BufReader<Socket>,
    pub(crate) writer: BufWriter<Socket>,
    /// The TLS relay, if any: dropped (and joined) after the reader and writer are done.
    pub(crate) tls: Option<TlsLink>,
}

/// One finished request. `result` holds the data of a READ (empty for other commands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub cookie: u64,
    pub command: Command,
    pub result: Result<Vec<u8>, NbdError>,
}

struct Pending {
    command: Command,
    offset: u64,
    /// A READ's data, assembled from chunks in any order.
    data: Vec<u8>,
    /// The first error chunk of a structured reply.
    error: Option<NbdError>,
}

/// A connection to one export, in the transmission phase.
pub struct Client {
    reader: BufReader<Socket>,
    writer: BufWriter<Socket>,
    export: ExportInfo,
    next_cookie: u64,
    pending: HashMap<u64, Pending>,
    /// Completions that arrived while a blocking call waited for another cookie.
    ready: VecDeque<Completion>,
    /// With TLS, the relay the reader and writer talk through (their socket is its plaintext
    /// end). Last, so it is dropped (and joined) after them.
    _tls: Option<TlsLink>,
}

impl Client {
    /// Connects and negotiates the export the URI names; an `nbds://` URI runs TLS with its PSK.
    pub fn connect(uri: &NbdUri, config: &ClientConfig) -> Result<Client, ClientError> {
        let (socket, tls) = match uri {
            NbdUri::Tcp { host, port, tls, .. } => {
                let stream = TcpStream::connect((host.as_str(), *port))?;
                stream.set_nodelay(true)?;
                (Socket::tcp(stream), tls.as_ref())
            }
            NbdUri::Unix { socket_path, .. } => (Socket::unix(UnixStream::connect(socket_path)?), None),
        };
        Client::handshake(socket, tls, uri.export_name(), config, None)
    }

    /// As [`Client::connect`], but nothing waits on the server longer than `timeout`: the
    /// connection (each address the host resolves to), and each read or write of the handshake
    /// (the socket's own timeouts, left set: the caller clears or keeps them). For a client
    /// that must not hang on a link that stalls (a member drive reconnecting).
    pub fn connect_within(uri: &NbdUri, config: &ClientConfig, timeout: std::time::Duration) -> Result<Client, ClientError> {
        let (socket, tls) = match uri {
            NbdUri::Tcp { host, port, tls, .. } => (Socket::tcp(tcp_connect_within(host, *port, timeout)?), tls.as_ref()),
            NbdUri::Unix { socket_path, .. } => (Socket::unix(UnixStream::connect(socket_path)?), None),
        };
        socket.set_read_timeout(Some(timeout))?;
        socket.set_write_timeout(Some(timeout))?;
        Client::handshake(socket, tls, uri.export_name(), config, Some(timeout)).map_err(|error| match error {
            // A socket timeout reads as EAGAIN: say what it means.
            ClientError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                ClientError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the server did not answer the handshake within {} s", timeout.as_secs_f64()),
                ))
            }
            other => other,
        })
    }

    /// Greeting, TLS if asked for, options, on a connected socket.
    fn handshake(
        socket: Socket,
        tls: Option<&UriTls>,
        export_name: &str,
        config: &ClientConfig,
        timeout: Option<std::time::Duration>,
    ) -> Result<Client, ClientError> {
        let mut reader = BufReader::new(socket.clone());
        let mut writer = BufWriter::new(socket.clone());
        let no_zeroes = greet(&mut reader, &mut writer)?;
        let link = match tls {
            Some(tls) => {
                let link = start_tls(&mut reader, &mut writer, &socket, tls, timeout.unwrap_or(TLS_TIMEOUT))?;
                if timeout.is_some() {
                    // What follows goes through the relay: the same bound on its plaintext end.
                    link.socket().set_read_timeout(timeout)?;
                    link.socket().set_write_timeout(timeout)?;
                }
                reader = BufReader::new(link.socket().clone());
                writer = BufWriter::new(link.socket().clone());
                Some(link)
            }
            None => None,
        };
        let export = haggle(&mut reader, &mut writer, export_name, no_zeroes, config)?;
        Ok(Client { reader, writer, export, next_cookie: 1, pending: HashMap::new(), ready: VecDeque::new(), _tls: link })
    }

    /// The connection in the transmission phase, taken apart for a client that reads replies
    /// and writes requests on two threads of its own (`member`). Nothing may be in flight.
    pub(crate) fn into_parts(self) -> ClientParts {
        assert_eq!(self.in_flight(), 0, "requests in flight on a client taken apart");
        ClientParts { reader: self.reader, writer: self.writer, tls: self._tls }
    }

    pub fn export(&self) -> &ExportInfo {
        &self.export
    }

    /// Requests sent or queued whose completion has not been returned yet.
    pub fn in_flight(&self) -> usize {
        self.pending.len() + self.ready.len()
    }

    pub fn submit_read(&mut self, offset: u64, len_bytes: u32) -> Result<u64, ClientError> {
        self.submit_request(Command::Read, 0, offset, len_bytes, &[])
    }

    pub fn submit_write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<u64, ClientError> {
        let flags = if fua { proto::NBD_CMD_FLAG_FUA } else { 0 };
        let len_bytes = u32::try_from(data.len()).expect("a write fits in u32 bytes");
        self.submit_request(Command::Write, flags, offset, len_bytes, data)
    }

    pub fn submit_flush(&mut self) -> Result<u64, ClientError> {
        self.submit_request(Command::Flush, 0, 0, 0, &[])
    }

    pub fn submit_trim(&mut self, offset: u64, len_bytes: u32) -> Result<u64, ClientError> {
        self.submit_request(Command::Trim, 0, offset, len_bytes, &[])
    }

    pub fn submit_write_zeroes(&mut self, offset: u64, len_bytes: u32, no_hole: bool) -> Result<u64, ClientError> {
        let flags = if no_hole { proto::NBD_CMD_FLAG_NO_HOLE } else { 0 };
        self.submit_request(Command::WriteZeroes, flags, offset, len_bytes, &[])
    }

    /// Queues any request with any flags, unchecked, so tests can send what a careless client
    /// would. `payload` must be the WRITE's `len_bytes` bytes, and empty otherwise.
    pub fn submit_request(
        &mut self,
        command: Command,
        flags: u16,
        offset: u64,
        len_bytes: u32,
        payload: &[u8],
    ) -> Result<u64, ClientError> {
        assert!(command != Command::Disc, "use disconnect()");
        let expected_payload_bytes = if command == Command::Write { len_bytes as usize } else { 0 };
        assert_eq!(payload.len(), expected_payload_bytes, "payload must match the request");
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let request = Request { flags, command, cookie, offset, len_bytes };
        self.writer.write_all(&proto::encode_request(&request))?;
        self.writer.write_all(payload)?;
        let data = if command == Command::Read { vec![0; len_bytes as usize] } else { Vec::new() };
        self.pending.insert(cookie, Pending { command, offset, data, error: None });
        Ok(cookie)
    }

    /// Sends the requests submitted so far (they are buffered until this or `wait`).
    pub fn send_submitted(&mut self) -> Result<(), ClientError> {
        self.writer.flush().map_err(ClientError::from)
    }

    /// Whether reply bytes have already been read from the socket, so `wait` starts without
    /// blocking on it; when false, poll [`Client::socket_fd`] for input first.
    pub fn reply_buffered(&self) -> bool {
        !self.reader.buffer().is_empty()
    }

    /// The socket, for `poll(2)` beside other descriptors. Reading or writing it directly would
    /// break the stream.
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        self.reader.get_ref().raw_fd()
    }

    /// Sends what is queued and returns the next completion, in the server's order.
    pub fn wait(&mut self) -> Result<Completion, ClientError> {
        if let Some(completion) = self.ready.pop_front() {
            return Ok(completion);
        }
        if self.pending.is_empty() {
            return Err(ClientError::NothingInFlight);
        }
        self.writer.flush()?;
        loop {
            if let Some(completion) = self.read_message()? {
                return Ok(completion);
            }
        }
    }

    /// Waits for one cookie; other completions are kept for later `wait` calls.
    pub fn wait_for(&mut self, cookie: u64) -> Result<Completion, ClientError> {
        if let Some(position) = self.ready.iter().position(|completion| completion.cookie == cookie) {
            return Ok(self.ready.remove(position).expect("position is valid"));
        }
        assert!(self.pending.contains_key(&cookie), "cookie {cookie} is not in flight");
        self.writer.flush()?;
        loop {
            let Some(completion) = self.read_message()? else {
                continue;
            };
            if completion.cookie == cookie {
                return Ok(completion);
            }
            self.ready.push_back(completion);
        }
    }

    /// Reads `len_bytes` at `offset`, blocking.
    pub fn read(&mut self, offset: u64, len_bytes: u32) -> Result<Vec<u8>, ClientError> {
        let cookie = self.submit_read(offset, len_bytes)?;
        self.wait_for(cookie)?.result.map_err(ClientError::Server)
    }

    /// Writes `data` at `offset`, blocking until the server acknowledges it.
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), ClientError> {
        let cookie = self.submit_write(offset, data, fua)?;
        self.finish(cookie)
    }

    pub fn flush(&mut self) -> Result<(), ClientError> {
        let cookie = self.submit_flush()?;
        self.finish(cookie)
    }

    pub fn trim(&mut self, offset: u64, len_bytes: u32) -> Result<(), ClientError> {
        let cookie = self.submit_trim(offset, len_bytes)?;
        self.finish(cookie)
    }

    pub fn write_zeroes(&mut self, offset: u64, len_bytes: u32, no_hole: bool) -> Result<(), ClientError> {
        let cookie = self.submit_write_zeroes(offset, len_bytes, no_hole)?;
        self.finish(cookie)
    }

    fn finish(&mut self, cookie: u64) -> Result<(), ClientError> {
        self.wait_for(cookie)?.result.map(drop).map_err(ClientError::Server)
    }

    /// Sends NBD_CMD_DISC (a soft disconnect) after waiting for everything in flight.
    pub fn disconnect(mut self) -> Result<Vec<Completion>, ClientError> {
        let mut completions = Vec::new();
        while self.in_flight() > 0 {
            completions.push(self.wait()?);
        }
        let request = Request { flags: 0, command: Command::Disc, cookie: 0, offset: 0, len_bytes: 0 };
        self.writer.write_all(&proto::encode_request(&request))?;
        self.writer.flush()?;
        let _ = self.writer.get_ref().shutdown(Shutdown::Write);
        Ok(completions)
    }

    /// Reads one reply message; returns a completion when it finished a request.
    fn read_message(&mut self) -> Result<Option<Completion>, ClientError> {
        let mut header = [0u8; proto::STRUCTURED_REPLY_HEADER_BYTES];
        self.reader.read_exact(&mut header[..4])?;
        let header_bytes = proto::reply_header_bytes(&header[..4])?;
        self.reader.read_exact(&mut header[4..header_bytes])?;
        match proto::parse_reply_header(&header[..header_bytes])? {
            ReplyHeader::Simple { error, cookie } => self.read_simple(error, cookie).map(Some),
            ReplyHeader::Chunk { flags, chunk_type, cookie, payload_len_bytes } => {
                self.read_chunk(chunk_type, cookie, payload_len_bytes)?;
                if flags & proto::NBD_REPLY_FLAG_DONE == 0 {
                    return Ok(None);
                }
                let pending = self.take_pending(cookie)?;
                Ok(Some(complete(cookie, pending)))
            }
        }
    }

    fn take_pending(&mut self, cookie: u64) -> Result<Pending, ClientError> {
        self.pending.remove(&cookie).ok_or_else(|| bad_reply(format!("reply for unknown cookie {cookie}")))
    }

    fn read_simple(&mut self, error: u32, cookie: u64) -> Result<Completion, ClientError> {
        let mut pending = self.take_pending(cookie)?;
        if error != 0 {
            pending.error = Some(NbdError { error, message: String::new() });
        } else if pending.command == Command::Read {
            self.reader.read_exact(&mut pending.data)?;
        }
        Ok(complete(cookie, pending))
    }

    fn read_chunk(&mut self, chunk_type: u16, cookie: u64, payload_len_bytes: u32) -> Result<(), ClientError> {
        let pending = self.pending.get_mut(&cookie).ok_or_else(|| bad_reply(format!("chunk for unknown cookie {cookie}")))?;
        let payload_len_bytes = payload_len_bytes as usize;
        match chunk_type {
            proto::NBD_REPLY_TYPE_NONE if payload_len_bytes == 0 => Ok(()),
            proto::NBD_REPLY_TYPE_OFFSET_DATA if payload_len_bytes > 8 => {
                let start = chunk_start(pending, read_u64(&mut self.reader)?, payload_len_bytes - 8)?;
                self.reader.read_exact(&mut pending.data[start..start + payload_len_bytes - 8])?;
                Ok(())
            }
            proto::NBD_REPLY_TYPE_OFFSET_HOLE if payload_len_bytes == 12 => {
                let offset = read_u64(&mut self.reader)?;
                let mut hole_bytes = [0u8; 4];
                self.reader.read_exact(&mut hole_bytes)?;
                let hole_len_bytes = u32::from_be_bytes(hole_bytes) as usize;
                let start = chunk_start(pending, offset, hole_len_bytes)?;
                pending.data[start..start + hole_len_bytes].fill(0);
                Ok(())
            }
            error_type if error_type & proto::NBD_REPLY_TYPE_ERROR_BIT != 0 => {
                if payload_len_bytes > proto::STRING_MAX_BYTES + 14 {
                    return Err(bad_reply(format!("error chunk of {payload_len_bytes} bytes")));
                }
                let mut payload = vec![0u8; payload_len_bytes];
                self.reader.read_exact(&mut payload)?;
                let chunk = proto::parse_error_chunk(error_type, &payload)?;
                pending.error.get_or_insert(NbdError { error: chunk.error, message: chunk.message });
                Ok(())
            }
            _ => Err(bad_reply(format!("unexpected chunk type {chunk_type} with {payload_len_bytes} bytes"))),
        }
    }
}

/// Where a content chunk starts inside its READ's buffer; it must lie within the request.
fn chunk_start(pending: &Pending, offset: u64, len_bytes: usize) -> Result<usize, ClientError> {
    let start = offset.checked_sub(pending.offset).map(|start| start as usize);
    match start {
        Some(start) if pending.command == Command::Read && start + len_bytes <= pending.data.len() => Ok(start),
        _ => Err(bad_reply(format!("chunk at offset {offset} of {len_bytes} bytes lies outside its request"))),
    }
}

fn complete(cookie: u64, pending: Pending) -> Completion {
    let result = match pending.error {
        Some(error) => Err(error),
        None => Ok(pending.data),
    };
    Completion { cookie, command: pending.command, result }
}

fn read_u64(reader: &mut impl Read) -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    reader.read_exact(&mut bytes)?;
    Ok(u64::from_be_bytes(bytes))
}
