//! One connection's thread: the handshake (with TLS when the client asks and the listener
//! offers it), then the transmission phase of the chosen export; and its registration, which
//! ends with the thread however the thread ends.

use std::io;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use super::round_trips::RoundTrips;
use super::{
    handshake, in_flight, transmission, ConnectionError, ConnectionSlot, Export, ExportIdentity, ListenerState, Shared,
    CONNECTION_THREAD_STACK_BYTES,
};
use crate::socket::{DeadlineSocket, Socket};
use crate::tls::{TlsLink, TlsMode, TlsServer};

/// Removes a connection from the registry when its thread ends, however it ends.
struct Registration {
    state: Arc<ListenerState>,
    id: u64,
    _slot: ConnectionSlot,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.state.connections.lock().unwrap().open.remove(&self.id);
        self.state.connections_changed.notify_all();
    }
}

pub(super) fn spawn_connection(socket: Socket, slot: ConnectionSlot, shared: &Arc<Shared>, state: &Arc<ListenerState>) -> io::Result<()> {
    let id = state.register(&socket);
    let registration = Registration { state: Arc::clone(state), id, _slot: slot };
    let shared = Arc::clone(shared);
    let builder = thread::Builder::new().name("nbd-conn".into()).stack_size(CONNECTION_THREAD_STACK_BYTES);
    builder.spawn(move || {
        let peer = socket.peer_name();
        match run_connection(socket, &shared, &registration) {
            Ok(()) => tracing::debug!(%peer, "nbd: connection closed"),
            Err(error) => {
                if let Some(suppressed_count) = shared.drops_log.admit(Instant::now()) {
                    tracing::warn!(%peer, %error, suppressed_count, "nbd: connection dropped");
                }
            }
        }
        drop(registration);
    })?;
    Ok(())
}

/// Handshake, then the transmission phase of the chosen export, on this thread.
fn run_connection(socket: Socket, shared: &Shared, registration: &Registration) -> Result<(), ConnectionError> {
    let deadline = Instant::now() + shared.config.handshake_timeout;
    let exports = shared.exports();
    // Declared before the transport that uses it, so that it is dropped (and its relay joined)
    // after every clone of its plaintext end.
    let mut tls_link: Option<TlsLink> = None;
    let (negotiated, mut transport) = handshake_over(socket, &exports, shared, registration, deadline, &mut tls_link)?;
    let handshake::Negotiated::Transmission { export_index, structured_replies } = negotiated else {
        return Ok(());
    };
    let export = &exports[export_index];
    let identity = export.identity();
    if !registration.state.enter_transmission(registration.id, identity.clone(), shared) {
        tracing::debug!(export = export.name(), "nbd: export removed during the handshake; closing");
        return Ok(());
    }
    transport.reader.get_mut().clear_deadline()?;
    transport.reader.get_mut().set_poll_budget(shared.config.poll_budget);
    transport.socket.set_write_timeout(Some(shared.config.reply_stall_timeout))?;
    let session = transmission::Session {
        reader: transport.reader,
        socket: transport.socket,
        structured_replies,
        limits: transmission::RequestLimits {
            size_bytes: export.size_bytes(),
            block_size_bytes: export.block_sizes().min_bytes,
            payload_max_bytes: export.block_sizes().max_bytes,
            transmission_flags: export.transmission_flags(structured_replies),
        },
        in_flight: in_flight::InFlight::new(&shared.config, Arc::clone(&registration.state), Arc::clone(&shared.payload_budget)),
        client_gone: Arc::default(),
        readers: shared.config.readers_per_connection,
        hand_over: shared.config.hand_over,
        round_trips: shared.config.hand_over.measures_round_trips().then(|| RoundTrips::new(Arc::clone(&shared.turn_choices))),
        reply_counts: Arc::clone(&shared.reply_counts),
    };
    count_connection(shared, &identity, true);
    let outcome = export.device.serve(session);
    count_connection(shared, &identity, false);
    outcome
}

/// The socket a connection's handshake and transmission run over: the TCP or Unix socket, or
/// the plaintext end of a TLS relay.
struct Transport {
    reader: io::BufReader<DeadlineSocket>,
    socket: Socket,
}

/// The reader's buffer: a few 4 KiB writes or hundreds of read requests per `recv`, so that
/// the replies of what one `recv` brought go out together (the cork). Larger payloads are read
/// past it, straight into their buffers.
const REQUEST_BUFFER_BYTES: usize = 64 << 10;

impl Transport {
    fn new(socket: Socket, deadline: Instant) -> Transport {
        let reader = io::BufReader::with_capacity(REQUEST_BUFFER_BYTES, DeadlineSocket::new(socket.clone(), deadline));
        Transport { reader, socket }
    }

    fn writer(&self, deadline: Instant) -> io::BufWriter<DeadlineSocket> {
        io::BufWriter::new(DeadlineSocket::new(self.socket.clone(), deadline))
    }
}

/// Runs the handshake, switching to TLS when the client asks and the listener offers it.
fn handshake_over(
    socket: Socket,
    exports: &[Export],
    shared: &Shared,
    registration: &Registration,
    deadline: Instant,
    tls_link: &mut Option<TlsLink>,
) -> Result<(handshake::Negotiated, Transport), ConnectionError> {
    let tls = registration.state.tls.as_ref();
    let tls_state = match tls.map(TlsServer::mode) {
        None => handshake::TlsState::Unavailable,
        Some(mode) => handshake::TlsState::Offered { required: mode == TlsMode::Require },
    };
    let mut transport = Transport::new(socket.clone(), deadline);
    let mut writer = transport.writer(deadline);
    let mut haggling = handshake::greet(&mut transport.reader, &mut writer, exports, tls_state)?;
    loop {
        let negotiated = haggling.run(&mut transport.reader, &mut writer)?;
        let (handshake::Negotiated::StartTls, Some(tls)) = (&negotiated, tls) else {
            return Ok((negotiated, transport));
        };
        // Bytes read past STARTTLS were sent before its answer: plaintext that must not be taken
        // as part of the TLS session (the STARTTLS injection flaw).
        if !transport.reader.buffer().is_empty() {
            return Err(ConnectionError::Protocol("the client sent data after NBD_OPT_STARTTLS before the TLS handshake".into()));
        }
        let link = tls.accept(&socket, deadline, shared.config.reply_stall_timeout)?;
        registration.state.attach_plain(registration.id, link.socket());
        transport = Transport::new(link.socket().clone(), deadline);
        writer = transport.writer(deadline);
        *tls_link = Some(link);
        haggling.tls_started();
    }
}

fn count_connection(shared: &Shared, identity: &ExportIdentity, opened: bool) {
    let mut counts = shared.connections_by_export.lock().expect("connection counts poisoned");
    let count = counts.entry(identity.clone()).or_insert(0);
    if opened {
        *count += 1;
    } else {
        *count -= 1;
    }
}
