//! A member drive's supervisor thread: it watches the connection in use for a request that
//! waits longer than the timeout (the link stalled: it is cut, and every request fails), and
//! while the link is down it reconnects, with a backoff, until the drive is dropped.

use super::connection::Connection;
use super::link::Link;
use super::probe::Probe;
use super::{check_export, Checked};
use crate::client::{Client, ClientConfig};
use crate::uri::NbdUri;
use drive::DriveInfo;
use std::sync::Arc;
use std::time::Duration;

/// The first wait before reconnecting after the link went down; doubled after each failed
/// attempt up to [`RECONNECT_BACKOFF_MAX`].
pub(super) const RECONNECT_BACKOFF_FIRST: Duration = Duration::from_millis(250);
pub(super) const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What the supervisor needs to reconnect.
pub(super) struct Reconnect {
    pub(super) uri: NbdUri,
    /// The drive as opened (its capacity is what a new connection must offer).
    pub(super) info: DriveInfo,
}

/// Why a reconnection did not go live.
enum Failure {
    /// Not reached, or not usable.
    Connect(String),
    /// Reached, and refused by the reconnection check.
    Refused(String),
}

/// Runs until the drive is dropped: watch the connection, join it once cut, reconnect.
pub(super) fn run(link: &Arc<Link>, first: Connection, reconnect: &Reconnect) {
    let mut connection = Some(first);
    let mut backoff = RECONNECT_BACKOFF_FIRST;
    loop {
        if let Some(connection) = connection.take() {
            watch(link);
            connection.join();
            backoff = RECONNECT_BACKOFF_FIRST;
        }
        if wait_unless_stopping(link, backoff) {
            return;
        }
        match connect(link, reconnect) {
            Ok(made) => connection = Some(made),
            Err(Failure::Connect(error)) => {
                tracing::debug!(drive = %link.name, %error, "reconnection failed");
                link.lock().last_error = Some(error);
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
            }
            Err(Failure::Refused(why)) => {
                tracing::warn!(drive = %link.name, %why, "reconnection refused");
                link.lock().refused = Some(why);
                backoff = RECONNECT_BACKOFF_MAX;
            }
        }
    }
}

/// Returns once the connection in use is cut: by its reader or writer, by a request older than
/// the timeout (cut here), or by a stop (cut here).
fn watch(link: &Link) {
    let tick = (link.timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut state = link.lock();
    loop {
        let Some(generation) = state.up.as_ref().map(|up| up.generation) else { return };
        let stalled = state.oldest_submitted().is_some_and(|submitted| submitted.elapsed() > link.timeout);
        if state.stopping || stalled {
            let reason = match state.stopping {
                true => "the drive is closed".to_string(),
                false => format!("no reply within {} s", link.timeout.as_secs_f64()),
            };
            drop(state);
            link.cut(generation, reason);
            return;
        }
        state = link.supervisor_wake.wait_timeout(state, tick).unwrap_or_else(std::sync::PoisonError::into_inner).0;
    }
}

/// Waits `backoff` (woken early by a stop); whether the drive is stopping.
fn wait_unless_stopping(link: &Link, backoff: Duration) -> bool {
    let state = link.lock();
    let (state, _) =
        link.supervisor_wake.wait_timeout_while(state, backoff, |state| !state.stopping).unwrap_or_else(std::sync::PoisonError::into_inner);
    state.stopping
}

/// One attempt: the same export (same size, and whatever the reconnection check looks at) must
/// answer within the timeout.
fn connect(link: &Arc<Link>, reconnect: &Reconnect) -> Result<Connection, Failure> {
    let client =
        Client::connect_within(&reconnect.uri, &ClientConfig::default(), link.timeout).map_err(|e| Failure::Connect(e.to_string()))?;
    let checked = check_export(&client, Some(reconnect.info.capacity_bytes)).map_err(Failure::Connect)?;
    let check = link.reconnect_check.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    let client = match check {
        Some(check) => {
            let probe = Probe::new(client, reconnect.info.clone());
            check(&probe).map_err(Failure::Refused)?;
            probe.into_client()
        }
        None => client,
    };
    attach(link, client, &checked).map_err(|e| Failure::Connect(format!("cannot start the connection's threads: {e}")))
}

/// Makes a connected client the link's connection, with its reader and writer threads.
pub(super) fn attach(link: &Arc<Link>, client: Client, checked: &Checked) -> std::io::Result<Connection> {
    let parts = client.into_parts();
    let socket = parts.reader.get_ref().clone();
    // Replies may be far apart on an idle link; a write that makes no progress is a stall.
    socket.set_read_timeout(None)?;
    socket.set_write_timeout(Some(link.timeout))?;
    let mut state = link.lock();
    if state.stopping {
        return Err(std::io::Error::other("the drive is closed"));
    }
    let generation = state.connected(socket, checked.max_request_bytes, checked.can_flush);
    drop(state);
    Connection::start(link, parts, generation)
}
