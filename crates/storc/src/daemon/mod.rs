//! `storc serve`: the controller daemon.
//!
//! Threads: the engine's shards (data path), the NBD server's listener and per-connection
//! threads, the controller's watcher, and one small tokio runtime for the management API and
//! signals (control plane only).

pub mod api;
mod drives;
mod export;
mod nbd_limits;

use engine::config::{ControllerId, IoPolicy, ReadPolicy, WritePolicy};
use engine::controller::{Controller, CreateVdSpec, OfferedDrive};
use engine::{Engine, EngineConfig};
use layout::{Level, KIB};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// Where the default drives, the NBD socket and the API socket live.
    #[arg(long, default_value = "storc-data")]
    data_dir: PathBuf,
    /// A member drive: a file or block device path, mem:SIZE, hdd:7200|10k|15k:SIZE or
    /// ssd:sata|sas|nvme:SIZE. Repeat for more. Without any, eight 8 GiB sparse files in the data
    /// directory, with a RAID5 on slots 0-6 and slot 7 as a global hot spare on first start.
    #[arg(long = "drive")]
    drives: Vec<String>,
    /// NBD over TCP (loopback only), in addition to the Unix socket in the data directory.
    #[arg(long, default_value = "127.0.0.1:10809")]
    nbd_listen: String,
    /// Management API over TCP on loopback, in addition to the Unix socket (e.g. 127.0.0.1:9090).
    #[arg(long)]
    api_listen: Option<String>,
    /// Engine shards (default: one per core).
    #[arg(long)]
    shards: Option<usize>,
    #[command(flatten)]
    nbd_limits: nbd_limits::NbdLimitArgs,
}

pub fn run(args: &Args) -> Result<(), String> {
    check_loopback("--nbd-listen", &args.nbd_listen)?;
    if let Some(api) = &args.api_listen {
        check_loopback("--api-listen", api)?;
    }
    let default_layout = args.drives.is_empty();
    let offered: Vec<OfferedDrive> = if default_layout {
        drives::open_default(&args.data_dir)?
    } else {
        std::fs::create_dir_all(&args.data_dir).map_err(|e| format!("cannot create {}: {e}", args.data_dir.display()))?;
        args.drives.iter().map(|spec| drives::open_spec(spec)).collect::<Result<_, _>>()?
    };
    let shard_count = args.shards.unwrap_or_else(|| EngineConfig::default().shard_count);
    let engine = Arc::new(Engine::start(EngineConfig { shard_count, ..EngineConfig::default() }).map_err(|e| e.to_string())?);
    let id_file = args.data_dir.join("controller.id");
    let ours = read_controller_id(&id_file)?;
    let controller = Controller::open(Arc::clone(&engine), offered, ours).map_err(|e| e.to_string())?;
    let id = controller.config().controller_id;
    std::fs::write(&id_file, format!("{:032x}\n", id.0)).map_err(|e| format!("cannot write {}: {e}", id_file.display()))?;
    if default_layout && controller.config().vds.is_empty() && controller.foreign().is_empty() {
        create_default_layout(&controller)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let outcome = runtime.block_on(serve(args, Arc::clone(&controller)));
    controller.shutdown();
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
    };
    controller.create_vd(spec).map_err(|e| e.to_string())?;
    controller.add_hot_spare(7, Vec::new()).map_err(|e| e.to_string())
}

fn check_loopback(flag: &str, address: &str) -> Result<(), String> {
    let host = address.rsplit_once(':').map(|(h, _)| h.trim_matches(['[', ']'])).unwrap_or(address);
    if matches!(host, "127.0.0.1" | "localhost" | "::1") || host.starts_with("127.") {
        Ok(())
    } else {
        Err(format!("{flag} {address}: storc serves on loopback only; allowed: 127.0.0.0/8, localhost or [::1] with a port"))
    }
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

async fn serve(args: &Args, controller: Arc<Controller>) -> Result<(), String> {
    let nbd_socket = args.data_dir.join("nbd.sock");
    let api_socket = args.data_dir.join("api.sock");
    fresh_socket_path(&nbd_socket)?;
    fresh_socket_path(&api_socket)?;
    let server = nbd::Server::empty(args.nbd_limits.server_config()?).map_err(|e| e.to_string())?;
    let absolute = std::fs::canonicalize(&args.data_dir).unwrap_or_else(|_| args.data_dir.clone());
    let templates =
        vec![format!("nbd+unix:///{{}}?socket={}", absolute.join("nbd.sock").display()), format!("nbd://{}/{{}}", args.nbd_listen)];
    let pool = drive::BufPool::new(args.nbd_limits.idle_buffers_bytes_max());
    let state = Arc::new(api::AppState { controller: Arc::clone(&controller), nbd: server.clone(), endpoint_templates: templates, pool });
    api::refresh_exports(&state);
    let for_callback = Arc::clone(&state);
    controller.on_vds_changed(Box::new(move || api::refresh_exports(&for_callback)));
    let mut nbd_unix = server.serve_unix(&nbd_socket).map_err(|e| format!("NBD socket {}: {e}", nbd_socket.display()))?;
    let mut nbd_tcp = server.serve_tcp(&args.nbd_listen).map_err(|e| format!("NBD on {}: {e}", args.nbd_listen))?;
    let unix_listener = tokio::net::UnixListener::bind(&api_socket).map_err(|e| format!("API socket {}: {e}", api_socket.display()))?;
    let router = api::router(Arc::clone(&state));
    print_banner(&state, &absolute, args);
    let shutdown = shutdown_signal();
    let unix_api = axum::serve(unix_listener, router.clone()).with_graceful_shutdown(shutdown);
    let result = match &args.api_listen {
        Some(address) => {
            let tcp = tokio::net::TcpListener::bind(address).await.map_err(|e| format!("API on {address}: {e}"))?;
            let tcp_api = axum::serve(tcp, router).with_graceful_shutdown(shutdown_signal());
            tokio::try_join!(unix_api, tcp_api).map(|_| ())
        }
        None => unix_api.await,
    };
    // In-flight NBD requests complete before the listeners go; then the controller flushes.
    nbd_unix.shutdown();
    nbd_tcp.shutdown();
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

fn print_banner(state: &api::AppState, data_dir: &Path, args: &Args) {
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
    println!("reach it:");
    println!("  nbdinfo --list 'nbd+unix:///?socket={}/nbd.sock'", data_dir.display());
    println!("  nbdinfo nbd://{}/{first}", args.nbd_listen);
    println!("  storc /c0 show --api {}/api.sock", data_dir.display());
    println!("stop with Ctrl-C (in-flight I/O completes and the configuration is written)");
}
