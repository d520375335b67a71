//! `storc serve`: the controller daemon.
//!
//! Threads: the engine's shards (data path), the NBD server's listener and per-connection
//! threads, the controller's watcher, and one small tokio runtime for the management API and
//! signals (control plane only).

mod added_drives;
pub mod api;
mod api_bgi;
mod api_cc;
mod api_copyback;
mod api_journal;
mod api_listen;
mod api_migrate;
mod api_ssd_cache;
mod api_tls;
mod api_token;
mod api_vds;
mod console;
mod data_dir;
mod drives;
mod export;
mod io_stats;
mod links;
mod metrics;
mod nbd_limits;
mod nbd_tls;
mod peer_uid;
mod tcp_api;
mod thread_budget;

use engine::config::{ControllerId, IoPolicy, ReadPolicy, WritePolicy};
use engine::controller::{Controller, ControllerOptions, CreateVdSpec};
use engine::{Engine, EngineConfig};
use layout::{Level, KIB};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// Where the default drives, the NBD socket and the API socket live.
    #[arg(long, default_value = "storc-data")]
    data_dir: PathBuf,
    /// A member drive: a file or block device path, mem:SIZE, hdd:7200|10k|15k:SIZE,
    /// ssd:sata|sas|nvme:SIZE, an NBD export on another machine: nbd://HOST[:PORT]/EXPORT,
    /// nbds://USER@HOST[:PORT]/EXPORT?tls-psk-file=PATH or nbd+unix:///EXPORT?socket=PATH, with
    /// timeout=DURATION (1s-300s, default 10s) in the query: a request unanswered that long fails
    /// the member, and the link is reconnected in the background; or an RBD image of a Ceph
    /// cluster, rbd:POOL/IMAGE[?conf=PATH&id=USER&timeout=SECONDS] (librbd1 must be installed). Repeat for more. Without any, eight 8 GiB sparse files in the data
    /// directory, with a RAID5 on slots 0-6 and slot 7 as a global hot spare on first start.
    #[arg(long = "drive")]
    drives: Vec<String>,
    /// NBD over TCP on loopback (HOST:PORT), in addition to the owner-only Unix socket in the data
    /// directory; `none` turns TCP off. Without `--tls require`, every local user can read and
    /// write every VD through a TCP listener.
    #[arg(long, default_value = "127.0.0.1:10809")]
    nbd_listen: String,
    #[command(flatten)]
    tls: nbd_tls::TlsArgs,
    /// Lets the members of this group use the API and NBD Unix sockets (mode 0660, this group;
    /// the data directory becomes 0710, so they can reach the sockets and list nothing). The
    /// drive files, controller id and journal stay owner-only. Without it the sockets are 0600.
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Management API and web console over TCP on loopback, in addition to the Unix socket (e.g.
    /// 127.0.0.1:8080). It answers only the daemon's user and root, only a Host header naming the
    /// listener, and only requests carrying the token in <data-dir>/api.token (the console's
    /// page and login excepted). Beyond loopback only with --api-listen-any and
    /// --api-tls-certificates.
    #[arg(long)]
    api_listen: Option<String>,
    #[command(flatten)]
    api_tls: api_listen::ApiListenArgs,
    /// GET /metrics (Prometheus' text format) over the TCP API answers every local user, not only
    /// the daemon's user and root, so that a Prometheus running as its own user can scrape it.
    /// It shows states, VD names and counters, and changes nothing; every other route keeps the
    /// owner check. Needs --api-listen.
    #[arg(long)]
    metrics_any_user: bool,
    /// Engine shards (default: one per core).
    #[arg(long)]
    shards: Option<usize>,
    /// The cache's journal (its battery): a file (created at 2 GiB, zero-filled, if missing: twice the default cache), a block
    /// device, or an emulated SSD (ssd:sata|sas|nvme:SIZE). Given twice: a mirrored pair, which
    /// goes on with one leg when the other fails. Without one, WB VDs run WT.
    #[arg(long)]
    journal: Vec<String>,
    /// The controller cache, shared by the shards (e.g. 1GiB, 512MiB).
    #[arg(long, default_value = "1GiB")]
    cache_size: String,
    /// How far VDs with rdcache=ra read past every read (ADRA sizes its own windows).
    #[arg(long, default_value = "256KiB")]
    read_ahead: String,
    #[command(flatten)]
    nbd_limits: nbd_limits::NbdLimitArgs,
}

/// Where the TCP listeners bind, resolved and checked before anything is created.
struct TcpListen {
    nbd: Option<SocketAddr>,
    /// The NBD TCP listener's TLS (`--tls on|require`), its credentials loaded.
    nbd_tls: Option<nbd::TlsServer>,
    /// The management API's TCP listener (`--api-listen`), its certificate loaded.
    api: Option<api_listen::ApiListen>,
}

/// The TCP listening sockets, bound at start (see [`run`]).
struct BoundListeners {
    nbd: Option<std::net::TcpListener>,
    api: Option<std::net::TcpListener>,
}

impl BoundListeners {
    fn bind(listen: &TcpListen) -> Result<BoundListeners, String> {
        let nbd =
            listen.nbd.map(|address| std::net::TcpListener::bind(address).map_err(|e| format!("NBD on {address}: {e}"))).transpose()?;
        Ok(BoundListeners { nbd, api: listen.api.as_ref().map(api_listen::ApiListen::bind).transpose()? })
    }
}

/// `--nbd-listen none`: the NBD server on the Unix socket only.
const NBD_LISTEN_OFF: &str = "none";

pub fn run(args: &Args) -> Result<(), String> {
    let nbd = (args.nbd_listen != NBD_LISTEN_OFF).then(|| resolve_loopback("--nbd-listen", &args.nbd_listen)).transpose()?;
    let listen = TcpListen { nbd_tls: args.tls.server(nbd.is_some())?, nbd, api: args.api_tls.resolve(args.api_listen.as_deref())? };
    if args.metrics_any_user && listen.api.is_none() {
        return Err("--metrics-any-user opens GET /metrics of the TCP API to every local user: give --api-listen 127.0.0.1:PORT too \
                    (the Unix socket stays owner-only)"
            .into());
    }
    // Every flag is checked before anything is created: bad input changes nothing.
    let shard_count = args.shards.unwrap_or_else(|| EngineConfig::default().shard_count);
    let cache_bytes = drive::parse_size_bytes(&args.cache_size).map_err(|e| format!("--cache-size {}: {e}", args.cache_size))?;
    let read_ahead_bytes = drive::parse_size_bytes(&args.read_ahead).map_err(|e| format!("--read-ahead {}: {e}", args.read_ahead))?;
    if read_ahead_bytes < 4096 || read_ahead_bytes > cache_bytes / 16 {
        return Err(format!("--read-ahead {}: from 4KiB up to a sixteenth of --cache-size", args.read_ahead));
    }
    if args.journal.len() > 2 {
        return Err(format!("--journal is given {} times: give one device, or two for a mirrored pair", args.journal.len()));
    }
    args.drives.iter().try_for_each(|spec| drives::check_syntax("--drive", spec))?;
    args.journal.iter().try_for_each(|spec| drives::check_syntax("--journal", spec))?;
    let group = args.socket_group.as_deref().map(data_dir::SocketGroup::resolve).transpose()?;
    drives::check_distinct(&args.drives, &args.journal)?;
    data_dir::prepare(&args.data_dir, group.as_ref())?;
    // Held until the process exits. Before any drive is opened, as are the TCP ports: a start
    // that cannot run must not have assembled, replayed or resynced anything first.
    let _data_dir_lock = data_dir::lock(&args.data_dir)?;
    let bound = BoundListeners::bind(&listen)?;
    let token = Arc::new(api_token::ApiToken::load_or_create(&args.data_dir)?);
    let default_layout = args.drives.is_empty();
    let id_file = args.data_dir.join("controller.id");
    let ours = read_controller_id(&id_file)?;
    // After the first start a drive that cannot be opened is a dead disk, not a typo: its slot
    // comes up missing and the VDs serve degraded.
    let first_start = ours.is_none();
    let ((mut offered, mut startup_events), mut links) = match default_layout {
        true => (drives::open_default(&args.data_dir, first_start)?, Vec::new()),
        false => drives::open_specs(&args.drives, first_start)?,
    };
    // Drives added at run time (migration targets) come after the others, as if given last; one
    // that cannot be opened is a dead disk even on what looks like a first start.
    let added_specs: Vec<String> = added_drives::load(&args.data_dir)?.into_iter().filter(|spec| !args.drives.contains(spec)).collect();
    let ((more, more_events), more_links) = drives::open_specs(&added_specs, false)?;
    offered.extend(more);
    startup_events.extend(more_events);
    links.extend(more_links);
    let added = Arc::new(added_drives::AddedDrives::new(&args.data_dir, added_specs));
    let specs: Vec<&str> = args.journal.iter().map(String::as_str).collect();
    let journal = drives::open_journal_legs(&specs)?;
    // Closed after the controller's shutdown: an RBD image keeps its lock and watch until then.
    let to_close: Vec<Arc<dyn drive::Drive>> =
        offered.iter().map(|o| Arc::clone(&o.drive)).chain(journal.iter().map(|j| Arc::clone(&j.drive))).collect();
    let engine = Arc::new(
        Engine::start(EngineConfig { shard_count, cache_bytes, read_ahead_bytes, ..EngineConfig::default() }).map_err(|e| e.to_string())?,
    );
    let event_log_path = Some(args.data_dir.join("events.log"));
    let options = ControllerOptions { ours, event_log_path, startup_events, journal };
    let controller = Controller::open(Arc::clone(&engine), offered, options).map_err(|e| e.to_string())?;
    let id = controller.config().controller_id;
    data_dir::write_owner_only(&id_file, &format!("{:032x}\n", id.0)).map_err(|e| format!("cannot write {}: {e}", id_file.display()))?;
    if default_layout && controller.config().vds.is_empty() && controller.foreign().is_empty() {
        create_default_layout(&controller)?;
    }
    let link_watch =
        links::LinkWatch::start(Arc::clone(&controller), links).map_err(|e| format!("cannot start the NBD link watcher: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let outcome = runtime.block_on(serve(args, &listen, bound, group.as_ref(), Arc::clone(&controller), token, Arc::clone(&added)));
    // No re-add may start while the controller shuts down.
    link_watch.stop();
    controller.shutdown();
    for drive in to_close {
        drive.close();
    }
    added.close_all();
    outcome
}

/// The controller id kept in the data directory, so that with drives of several controllers
/// present the daemon knows which configuration is its own.
fn read_controller_id(path: &Path) -> Result<Option<ControllerId>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => u128::from_str_radix(text.trim(), 16)
            .map(|id| Some(ControllerId(id)))
            .map_err(|_| format!("{} does not hold a controller id (32 hex digits); remove it to adopt the drives' id", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// The embedded default: RAID5 `v0` on slots 0-6, slot 7 a global hot spare.
fn create_default_layout(controller: &Controller) -> Result<(), String> {
    let spec = CreateVdSpec {
        level: Level::Raid5,
        slots: (0..7).collect(),
        strip_size_bytes: 64 * KIB,
        name: Some("v0".into()),
        drives_per_span: None,
        write_policy: WritePolicy::WriteThrough,
        read_policy: ReadPolicy::NoReadAhead,
        io_policy: IoPolicy::Direct,
        seq_cutoff: engine::config::SeqCutoff::LevelDefault,
    };
    controller.create_vd(spec).map_err(|e| e.to_string())?;
    controller.add_hot_spare(7, Vec::new()).map_err(|e| e.to_string())
}

/// Resolves `address` and returns where to bind. Every address it resolves to must be loopback,
/// so that neither a name like `127.example.com` nor a name that resolves elsewhere opens the
/// daemon to the network; binding the resolved address means a later answer cannot change it.
fn resolve_loopback(flag: &str, address: &str) -> Result<SocketAddr, String> {
    const ALLOWED: &str = "allowed: an address in 127.0.0.0/8, [::1] or localhost, with a port (e.g. 127.0.0.1:10809)";
    let resolved: Vec<SocketAddr> = address
        .to_socket_addrs()
        .map_err(|error| format!("{flag} {address}: cannot resolve it ({error}); storc serves on loopback only; {ALLOWED}"))?
        .collect();
    if let Some(outside) = resolved.iter().find(|candidate| !candidate.ip().to_canonical().is_loopback()) {
        return Err(format!(
            "{flag} {address}: resolves to {}, which is not loopback; storc serves on loopback only; {ALLOWED}",
            outside.ip()
        ));
    }
    resolved.first().copied().ok_or_else(|| format!("{flag} {address}: resolves to no address; {ALLOWED}"))
}

/// Removes a socket file left behind by a daemon that did not stop cleanly.
fn fresh_socket_path(path: &Path) -> Result<(), String> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!("{} is in use: another storc serve runs on this data directory", path.display()));
        }
        std::fs::remove_file(path).map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
    }
    Ok(())
}

async fn serve(
    args: &Args,
    listen: &TcpListen,
    bound: BoundListeners,
    group: Option<&data_dir::SocketGroup>,
    controller: Arc<Controller>,
    token: Arc<api_token::ApiToken>,
    added_drives: Arc<added_drives::AddedDrives>,
) -> Result<(), String> {
    let nbd_socket = args.data_dir.join("nbd.sock");
    let api_socket = args.data_dir.join("api.sock");
    fresh_socket_path(&nbd_socket)?;
    fresh_socket_path(&api_socket)?;
    let server = nbd::Server::empty(args.nbd_limits.server_config(listen.nbd_tls.is_some())?).map_err(|e| e.to_string())?;
    let absolute = std::fs::canonicalize(&args.data_dir).unwrap_or_else(|_| args.data_dir.clone());
    let mut templates = vec![format!("nbd+unix:///{{}}?socket={}", absolute.join("nbd.sock").display())];
    if let Some(address) = listen.nbd {
        let tls_mode = listen.nbd_tls.as_ref().map(nbd::TlsServer::mode);
        if tls_mode != Some(nbd::TlsMode::Require) {
            templates.push(format!("nbd://{address}/{{}}"));
        }
        if tls_mode.is_some() {
            templates.push(format!("nbds://{address}/{{}}"));
        }
    }
    let pool = drive::BufPool::new(args.nbd_limits.idle_buffers_bytes_max());
    let io_stats = io_stats::IoStats::default();
    let state = Arc::new(api::AppState {
        controller: Arc::clone(&controller),
        nbd: server.clone(),
        endpoint_templates: templates,
        pool,
        io_stats,
        added_drives,
    });
    api::refresh_exports(&state);
    let for_callback = Arc::clone(&state);
    controller.on_vds_changed(Box::new(move || api::refresh_exports(&for_callback)));
    let mut nbd_unix = server.serve_unix(&nbd_socket).map_err(|e| format!("NBD socket {}: {e}", nbd_socket.display()))?;
    data_dir::restrict_socket(&nbd_socket, group)?;
    let mut nbd_tcp = bound
        .nbd
        .map(|listener| server.serve_tcp_listener(listener, listen.nbd_tls.clone()).map_err(|e| format!("NBD over TCP: {e}")))
        .transpose()?;
    let unix_listener = tokio::net::UnixListener::bind(&api_socket).map_err(|e| format!("API socket {}: {e}", api_socket.display()))?;
    data_dir::restrict_socket(&api_socket, group)?;
    let router = api::router(Arc::clone(&state));
    print_banner(&state, &absolute, listen, &args.tls);
    let shutdown = shutdown_signal();
    let unix_api = axum::serve(unix_listener, router.clone()).with_graceful_shutdown(shutdown);
    let result = match (&listen.api, bound.api) {
        (Some(api), Some(listener)) => {
            let tcp_api = api.serve(listener, router, args.metrics_any_user, token, shutdown_signal())?;
            tokio::try_join!(unix_api, tcp_api).map(|_| ())
        }
        _ => unix_api.await,
    };
    // In-flight NBD requests complete before the listeners go; then the controller flushes.
    nbd_unix.shutdown();
    if let Some(handle) = nbd_tcp.as_mut() {
        handle.shutdown();
    }
    let _ = std::fs::remove_file(&nbd_socket);
    let _ = std::fs::remove_file(&api_socket);
    result.map_err(|e| e.to_string())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("storc: stopping: finishing in-flight I/O, flushing, writing metadata");
}

fn print_banner(state: &api::AppState, data_dir: &Path, listen: &TcpListen, tls: &nbd_tls::TlsArgs) {
    let vds = state.controller.vds();
    println!("storc serving {} virtual drive(s) on {} drive(s)", vds.len(), state.controller.slots().len());
    for (record, vd) in &vds {
        println!(
            "  v{} {:?}: {} {:.1} GiB, {}",
            record.vd_id,
            record.name,
            record.level,
            vd.capacity_bytes() as f64 / (1u64 << 30) as f64,
            vd.state().short_name()
        );
    }
    let first = vds.first().map(|(r, _)| r.name.clone()).unwrap_or_else(|| "v0".into());
    let tls_mode = listen.nbd_tls.as_ref().map(nbd::TlsServer::mode);
    println!("reach it:");
    println!("  nbdinfo --list 'nbd+unix:///?socket={}/nbd.sock'", data_dir.display());
    if let Some(address) = listen.nbd {
        if tls_mode != Some(nbd::TlsMode::Require) {
            println!("  nbdinfo nbd://{address}/{first}");
        }
        if let Some(uri) = tls.client_uri(&address.to_string(), &first) {
            println!("  nbdinfo '{uri}'");
        }
    }
    println!("  storc /c0 show --api {}/api.sock", data_dir.display());
    for line in listen.api.iter().flat_map(|api| api.banner_lines(data_dir)) {
        println!("{line}");
    }
    if let (Some(address), Some(tls)) = (listen.nbd, &listen.nbd_tls) {
        println!("NBD over TCP on {address}: TLS {} with {} credentials", tls_mode_name(tls.mode()), tls.credentials_kind());
    }
    if let Some(address) = listen.nbd.filter(|_| tls_mode != Some(nbd::TlsMode::Require)) {
        let warning = match tls_mode {
            None => format!(
                "NBD over TCP on {address} has no TLS: every local user can read and write every VD through it; \
                 the Unix socket is owner-only; turn TCP off with --nbd-listen {NBD_LISTEN_OFF}"
            ),
            Some(_) => format!(
                "NBD over TCP on {address} serves plaintext clients too (--tls on): every local user can read and write \
                 every VD through it without TLS; refuse them with --tls require, or turn TCP off with --nbd-listen {NBD_LISTEN_OFF}"
            ),
        };
        println!("warning: {warning}");
        tracing::warn!("{warning}");
    }
    println!("stop with Ctrl-C (in-flight I/O completes and the configuration is written)");
}

fn tls_mode_name(mode: nbd::TlsMode) -> &'static str {
    match mode {
        nbd::TlsMode::On => "offered (--tls on; plaintext clients too)",
        nbd::TlsMode::Require => "required (--tls require; plaintext clients see no export)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(address: &str, expected: Result<&str, &str>) {
        let outcome = resolve_loopback("--nbd-listen", address);
        match expected {
            Ok(bound) => assert_eq!(outcome, Ok(bound.parse().unwrap()), "{address}"),
            Err(start) => {
                let message = outcome.expect_err(address);
                assert!(message.starts_with(start), "{address}: {message}");
                assert!(
                    message.ends_with("allowed: an address in 127.0.0.0/8, [::1] or localhost, with a port (e.g. 127.0.0.1:10809)"),
                    "{message}"
                );
            }
        }
    }

    #[test]
    fn listen_addresses_are_loopback_by_what_they_resolve_to() {
        check("127.0.0.1:10809", Ok("127.0.0.1:10809"));
        check("127.3.2.1:10809", Ok("127.3.2.1:10809"));
        check("[::1]:10809", Ok("[::1]:10809"));
        check("0.0.0.0:10809", Err("--nbd-listen 0.0.0.0:10809: resolves to 0.0.0.0, which is not loopback"));
        check("192.0.2.1:10809", Err("--nbd-listen 192.0.2.1:10809: resolves to 192.0.2.1, which is not loopback"));
        check("[::]:10809", Err("--nbd-listen [::]:10809: resolves to ::, which is not loopback"));
        check(
            "[::ffff:192.0.2.1]:10809",
            Err("--nbd-listen [::ffff:192.0.2.1]:10809: resolves to ::ffff:192.0.2.1, which is not loopback"),
        );
        check("127.evil.example:10809", Err("--nbd-listen 127.evil.example:10809: "));
        check("127.0.0.1", Err("--nbd-listen 127.0.0.1: cannot resolve it"));
        let localhost = resolve_loopback("--nbd-listen", "localhost:10809").expect("localhost resolves to loopback");
        assert!(localhost.ip().is_loopback() && localhost.port() == 10809, "localhost:10809 resolved to {localhost}");
    }
}
