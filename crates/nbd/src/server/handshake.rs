//! The fixed newstyle handshake, server side: greeting, client flags, then options until the
//! client picks an export (EXPORT_NAME or GO), leaves (ABORT or a closed socket), or asks for
//! TLS (STARTTLS: the caller runs the TLS handshake and haggling goes on over TLS).

use std::io::{Read, Write};

use super::{ConnectionError, Export};
use crate::proto::{self, ClientOption, Info, InfoRequest, ProtoError};

/// How option haggling ended.
pub(crate) enum Negotiated {
    /// The client aborted; nothing more to do.
    Closed,
    /// STARTTLS was acknowledged: the TLS handshake comes next, then [`Haggling::run`] again.
    StartTls,
    Transmission {
        export_index: usize,
        structured_replies: bool,
    },
}

/// What the listener offers of TLS, and whether this connection has it yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsState {
    /// The listener has no TLS: STARTTLS is an unsupported option.
    Unavailable,
    /// STARTTLS is offered; with `required`, nothing else is served before it.
    Offered {
        required: bool,
    },
    Active,
}

/// What one option leads to.
enum Step {
    Continue,
    Closed,
    StartTls,
    Transmission { export_index: usize },
}

/// Sends the greeting and reads the client's flags.
pub(crate) fn greet<'a>(
    reader: &mut impl Read,
    writer: &mut impl Write,
    exports: &'a [Export],
    tls: TlsState,
) -> Result<Haggling<'a>, ConnectionError> {
    writer.write_all(&proto::encode_greeting(proto::SERVER_HANDSHAKE_FLAGS))?;
    writer.flush()?;
    let mut flags_bytes = [0u8; proto::CLIENT_FLAGS_BYTES];
    reader.read_exact(&mut flags_bytes)?;
    let client_flags = proto::parse_client_flags(&flags_bytes, proto::SERVER_HANDSHAKE_FLAGS).map_err(protocol)?;
    Ok(Haggling { exports, no_zeroes: client_flags.no_zeroes, structured_replies: false, tls })
}

fn protocol(error: ProtoError) -> ConnectionError {
    ConnectionError::Protocol(error.to_string())
}

/// Reads one option. An oversized one gets NBD_REP_ERR_TOO_BIG and a hard disconnect: reading
/// gigabytes to skip it would be the denial of service it probably is.
fn read_option(reader: &mut impl Read, writer: &mut impl Write) -> Result<(u32, Vec<u8>), ConnectionError> {
    let mut header_bytes = [0u8; proto::OPTION_HEADER_BYTES];
    reader.read_exact(&mut header_bytes)?;
    let header = match proto::parse_option_header(&header_bytes) {
        Ok(header) => header,
        Err(error @ ProtoError::OptionTooLong { option, .. }) => {
            let message = error.to_string();
            writer.write_all(&proto::encode_option_reply(option, proto::NBD_REP_ERR_TOO_BIG, message.as_bytes()))?;
            writer.flush()?;
            return Err(protocol(error));
        }
        Err(error) => return Err(protocol(error)),
    };
    let mut data = vec![0u8; header.len_bytes as usize];
    reader.read_exact(&mut data)?;
    Ok((header.option, data))
}

/// The negotiation state that options change.
pub(crate) struct Haggling<'a> {
    exports: &'a [Export],
    no_zeroes: bool,
    structured_replies: bool,
    tls: TlsState,
}

/// What a plaintext client hears from a listener that requires TLS.
const TLS_REQUIRED_MESSAGE: &str = "this server requires TLS: send NBD_OPT_STARTTLS first";

impl Haggling<'_> {
    /// Answers options until one ends haggling.
    pub(crate) fn run(&mut self, reader: &mut impl Read, writer: &mut impl Write) -> Result<Negotiated, ConnectionError> {
        loop {
            let (option, data) = read_option(reader, writer)?;
            let step = self.answer(option, &data, writer)?;
            writer.flush()?;
            match step {
                Step::Continue => {}
                Step::Closed => return Ok(Negotiated::Closed),
                Step::StartTls => return Ok(Negotiated::StartTls),
                Step::Transmission { export_index } => {
                    return Ok(Negotiated::Transmission { export_index, structured_replies: self.structured_replies });
                }
            }
        }
    }

    /// The TLS handshake succeeded. What was negotiated in plaintext is forgotten: a client
    /// negotiates over TLS what it wants to rely on.
    pub(crate) fn tls_started(&mut self) {
        self.tls = TlsState::Active;
        self.structured_replies = false;
    }

    fn answer(&mut self, option: u32, data: &[u8], writer: &mut impl Write) -> Result<Step, ConnectionError> {
        if self.tls == (TlsState::Offered { required: true }) && option != proto::NBD_OPT_STARTTLS && option != proto::NBD_OPT_ABORT {
            if option == proto::NBD_OPT_EXPORT_NAME {
                // It cannot be answered with an error: the spec says end the session.
                return Err(ConnectionError::Protocol(format!("NBD_OPT_EXPORT_NAME before TLS; {TLS_REQUIRED_MESSAGE}")));
            }
            reply_error(writer, option, proto::NBD_REP_ERR_TLS_REQD, TLS_REQUIRED_MESSAGE)?;
            return Ok(Step::Continue);
        }
        let parsed = match proto::parse_option(option, data) {
            Ok(parsed) => parsed,
            // EXPORT_NAME cannot be answered with an error: the spec says terminate.
            Err(error) if option == proto::NBD_OPT_EXPORT_NAME => return Err(protocol(error)),
            Err(error @ ProtoError::InvalidOption { .. }) => {
                reply_error(writer, option, proto::NBD_REP_ERR_INVALID, &error.to_string())?;
                return Ok(Step::Continue);
            }
            Err(error) => return Err(protocol(error)),
        };
        match parsed {
            ClientOption::ExportName { export_name } => self.export_name(&export_name, writer),
            ClientOption::Abort => {
                // The client may already have closed its end; the answer is a courtesy.
                let _ = writer.write_all(&proto::encode_option_reply(option, proto::NBD_REP_ACK, &[]));
                Ok(Step::Closed)
            }
            ClientOption::List => self.list(writer),
            ClientOption::Info(request) => self.info(option, &request, writer).map(|_| Step::Continue),
            ClientOption::Go(request) => match self.info(option, &request, writer)? {
                Some(export_index) => Ok(Step::Transmission { export_index }),
                None => Ok(Step::Continue),
            },
            ClientOption::StructuredReply => {
                self.structured_replies = true;
                writer.write_all(&proto::encode_option_reply(option, proto::NBD_REP_ACK, &[]))?;
                Ok(Step::Continue)
            }
            ClientOption::StartTls => self.start_tls(writer),
            ClientOption::Unsupported { option } => {
                reply_error(writer, option, proto::NBD_REP_ERR_UNSUP, &self.unsupported_message(option))?;
                Ok(Step::Continue)
            }
        }
    }

    fn start_tls(&self, writer: &mut impl Write) -> Result<Step, ConnectionError> {
        let option = proto::NBD_OPT_STARTTLS;
        match self.tls {
            TlsState::Unavailable => {
                reply_error(writer, option, proto::NBD_REP_ERR_UNSUP, &self.unsupported_message(option))?;
                Ok(Step::Continue)
            }
            TlsState::Offered { .. } => {
                writer.write_all(&proto::encode_option_reply(option, proto::NBD_REP_ACK, &[]))?;
                Ok(Step::StartTls)
            }
            TlsState::Active => {
                reply_error(writer, option, proto::NBD_REP_ERR_INVALID, "TLS is already active on this connection")?;
                Ok(Step::Continue)
            }
        }
    }

    fn unsupported_message(&self, option: u32) -> String {
        let starttls = if self.tls == TlsState::Unavailable { "" } else { ", STARTTLS" };
        let on_this = if option == proto::NBD_OPT_STARTTLS { " on this listener (it has no TLS)" } else { "" };
        format!("option {option} is not supported{on_this}; supported: EXPORT_NAME, ABORT, LIST, INFO, GO, STRUCTURED_REPLY{starttls}")
    }

    /// The empty name selects the default export, the first one; with no exports there is none.
    fn find(&self, export_name: &str) -> Option<usize> {
        if export_name.is_empty() {
            return (!self.exports.is_empty()).then_some(0);
        }
        self.exports.iter().position(|export| export.name() == export_name)
    }

    fn export_name(&self, export_name: &str, writer: &mut impl Write) -> Result<Step, ConnectionError> {
        let Some(export_index) = self.find(export_name) else {
            return Err(ConnectionError::Protocol(format!("NBD_OPT_EXPORT_NAME asked for unknown export {export_name:?}")));
        };
        let export = &self.exports[export_index];
        let flags = export.transmission_flags(self.structured_replies);
        writer.write_all(&proto::encode_export_name_reply(export.size_bytes(), flags, self.no_zeroes))?;
        Ok(Step::Transmission { export_index })
    }

    fn list(&self, writer: &mut impl Write) -> Result<Step, ConnectionError> {
        for export in self.exports {
            writer.write_all(&proto::encode_rep_server(export.name(), export.description()))?;
        }
        writer.write_all(&proto::encode_option_reply(proto::NBD_OPT_LIST, proto::NBD_REP_ACK, &[]))?;
        Ok(Step::Continue)
    }

    /// Answers INFO or GO; returns the export on success.
    fn info(&self, option: u32, request: &InfoRequest, writer: &mut impl Write) -> Result<Option<usize>, ConnectionError> {
        let Some(export_index) = self.find(&request.export_name) else {
            let message = unknown_export_message(&request.export_name, self.exports);
            reply_error(writer, option, proto::NBD_REP_ERR_UNKNOWN, &message)?;
            return Ok(None);
        };
        let export = &self.exports[export_index];
        let flags = export.transmission_flags(self.structured_replies);
        let mut infos = vec![Info::Export { size_bytes: export.size_bytes(), transmission_flags: flags }];
        if request.asks_for(proto::NBD_INFO_NAME) {
            infos.push(Info::Name(export.name().to_string()));
        }
        if let (true, Some(description)) = (request.asks_for(proto::NBD_INFO_DESCRIPTION), export.description()) {
            infos.push(Info::Description(description.to_string()));
        }
        // Always sent, asked for or not: 512-byte alignment is stricter than the default of 1.
        infos.push(Info::BlockSize(export.block_sizes()));
        for info in &infos {
            writer.write_all(&proto::encode_rep_info(option, info))?;
        }
        writer.write_all(&proto::encode_option_reply(option, proto::NBD_REP_ACK, &[]))?;
        Ok(Some(export_index))
    }
}

fn reply_error(writer: &mut impl Write, option: u32, reply_type: u32, message: &str) -> Result<(), ConnectionError> {
    writer.write_all(&proto::encode_option_reply(option, reply_type, message.as_bytes()))?;
    Ok(())
}

/// Why INFO or GO found no export, with what there is instead.
fn unknown_export_message(export_name: &str, exports: &[Export]) -> String {
    if exports.is_empty() {
        return format!("no export named {export_name:?}: this server has no exports yet");
    }
    let names: Vec<&str> = exports.iter().map(Export::name).collect();
    format!("no export named {export_name:?}; exports: {}", names.join(", "))
}
