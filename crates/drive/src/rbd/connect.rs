//! Opening an image: a cluster handle of its own, the pool's I/O context, the image.

use super::ffi::{self, Api, RadosIoctxT, RadosT, RbdImageT};
use super::RbdSpec;
use std::ffi::{c_char, CString};
use std::ptr::null_mut;

/// How long librados waits for the monitors at connect (its default is 300 s), unless the conf
/// sets `client_mount_timeout`: an unreachable cluster is an error a person sees while waiting.
const CONNECT_TIMEOUT_S: &str = "15";
/// After this an OSD operation that got no answer fails with ETIMEDOUT (librados' default is to
/// wait forever), unless the conf sets `rados_osd_op_timeout`: a member whose OSDs are gone then
/// fails like a disk that stops answering, instead of holding the VD's I/O without end.
const OP_TIMEOUT_S: &str = "30";

/// A cluster connection, a pool's I/O context and an open image; closed in that reverse order.
pub(super) struct Handles {
    pub(super) api: &'static Api,
    cluster: RadosT,
    ioctx: RadosIoctxT,
    pub(super) image: RbdImageT,
}

// SAFETY: librados cluster and I/O context handles and librbd image handles may be used from any
// thread, and librbd's AIO calls from several threads at once (each takes the image's locks);
// these handles are only used through those calls, and closed once, in `Drop`.
unsafe impl Send for Handles {}
// SAFETY: as above: every call made through a shared reference is a thread-safe librbd call.
unsafe impl Sync for Handles {}

impl Drop for Handles {
    fn drop(&mut self) {
        // SAFETY: each handle was opened by `open`, is not null past the step that set it, and
        // nothing uses it after this (no operation is in flight: `RbdDrive::drop` waited).
        unsafe {
            if !self.image.is_null() {
                (self.api.rbd_close)(self.image);
            }
            if !self.ioctx.is_null() {
                (self.api.rados_ioctx_destroy)(self.ioctx);
            }
            (self.api.rados_shutdown)(self.cluster);
        }
    }
}

/// What `open` found besides the handles.
pub(super) struct Opened {
    pub(super) handles: Handles,
    pub(super) size_bytes: u64,
    /// librbd's cache (`rbd_cache`) holds writes until a flush.
    pub(super) cached: bool,
    /// The image did not exist and was created.
    pub(super) created: bool,
}

fn c_string(spec: &RbdSpec, what: &str, text: &str) -> Result<CString, String> {
    CString::new(text).map_err(|_| format!("{spec}: the {what} holds a NUL byte"))
}

fn errno_text(rc: i32) -> String {
    std::io::Error::from_raw_os_error(-rc).to_string()
}

/// Connects as the spec's user with its conf and opens its image, first creating it with
/// `create_bytes` if given and the image does not exist.
///
/// # Errors
/// A message that quotes the spec and says what was tried: the conf read, the monitors asked,
/// the pool, the image (with the command that creates it).
pub(super) fn open(spec: &RbdSpec, create_bytes: Option<u64>) -> Result<Opened, String> {
    let api = ffi::api()?;
    let name = c_string(spec, "user", &spec.client_name())?;
    let mut cluster: RadosT = null_mut();
    // SAFETY: the out pointer is a live local; the strings are NUL-terminated and outlive the call.
    let rc = unsafe { (api.rados_create2)(&mut cluster, c"ceph".as_ptr(), name.as_ptr(), 0) };
    if rc < 0 {
        return Err(format!("{spec}: librados could not make a cluster handle: {}", errno_text(rc)));
    }
    // From here on the handles close themselves on every error path.
    let mut handles = Handles { api, cluster, ioctx: null_mut(), image: null_mut() };
    read_conf(&handles, spec)?;
    set_default(&handles, "client_mount_timeout", 300.0, CONNECT_TIMEOUT_S);
    set_default(&handles, "rados_osd_op_timeout", 0.0, OP_TIMEOUT_S);
    // The invariants the drive relies on, whatever the conf says: an AIO call only queues (the
    // shard never blocks in it), and a write's data is copied, so its buffer is not referenced
    // once the completion has been called.
    set(&handles, "rbd_non_blocking_aio", "true");
    set(&handles, "rbd_disable_zero_copy_writes", "true");
    // SAFETY: a configured handle that has not connected yet.
    let rc = unsafe { (api.rados_connect)(handles.cluster) };
    if rc < 0 {
        let conf = spec.conf.as_ref().map_or("the default ceph.conf".to_string(), |c| c.display().to_string());
        let monitors = get(&handles, "mon_host").unwrap_or_default();
        return Err(format!(
            "{spec}: cannot connect to the Ceph cluster as {} (conf {conf}, monitors {monitors:?}, waited up to {}s): {}",
            spec.client_name(),
            get(&handles, "client_mount_timeout").unwrap_or_default(),
            errno_text(rc)
        ));
    }
    let pool = c_string(spec, "pool", &spec.pool)?;
    // SAFETY: a connected cluster handle; the out pointer is a field of a live struct.
    let rc = unsafe { (api.rados_ioctx_create)(handles.cluster, pool.as_ptr(), &mut handles.ioctx) };
    if rc < 0 {
        return Err(match -rc {
            libc::ENOENT => format!("{spec}: pool {:?} does not exist (`ceph osd pool ls` lists the pools)", spec.pool),
            _ => format!("{spec}: cannot open pool {:?}: {}", spec.pool, errno_text(rc)),
        });
    }
    let created = match create_bytes {
        Some(size_bytes) => create_if_missing(&handles, spec, size_bytes)?,
        None => false,
    };
    open_image(handles, spec, created)
}

/// Creates the image unless it exists (EEXIST is no error: it is then opened as it is).
fn create_if_missing(handles: &Handles, spec: &RbdSpec, size_bytes: u64) -> Result<bool, String> {
    let image = c_string(spec, "image", &spec.image)?;
    // librbd's default object size (order 22, 4 MiB) when the order given is 0.
    let mut order: std::ffi::c_int = 0;
    // SAFETY: a live I/O context; NUL-terminated name; the order is a live local.
    let rc = unsafe { (handles.api.rbd_create)(handles.ioctx, image.as_ptr(), size_bytes, &mut order) };
    match rc {
        0 => Ok(true),
        rc if -rc == libc::EEXIST => Ok(false),
        rc => Err(format!("{spec}: cannot create image {} of {size_bytes} bytes: {}", spec.image_path(), errno_text(rc))),
    }
}

fn open_image(mut handles: Handles, spec: &RbdSpec, created: bool) -> Result<Opened, String> {
    let api = handles.api;
    let image = c_string(spec, "image", &spec.image)?;
    // SAFETY: a live I/O context; NUL-terminated name; a null snapshot opens the image itself.
    let rc = unsafe { (api.rbd_open)(handles.ioctx, image.as_ptr(), &mut handles.image, std::ptr::null()) };
    if rc < 0 {
        handles.image = null_mut();
        return Err(match -rc {
            libc::ENOENT => {
                format!("{spec}: image {} does not exist (create it with: rbd create --size 8G {})", spec.image_path(), spec.image_path())
            }
            _ => format!("{spec}: cannot open image {}: {}", spec.image_path(), errno_text(rc)),
        });
    }
    let mut size_bytes = 0u64;
    // SAFETY: an open image; the out pointer is a live local.
    let rc = unsafe { (api.rbd_get_size)(handles.image, &mut size_bytes) };
    if rc < 0 {
        return Err(format!("{spec}: cannot read the size of image {}: {}", spec.image_path(), errno_text(rc)));
    }
    let cached = get(&handles, "rbd_cache").is_none_or(|value| value == "true");
    Ok(Opened { handles, size_bytes, cached, created })
}

/// Reads the spec's conf, or the first of librados' default places.
fn read_conf(handles: &Handles, spec: &RbdSpec) -> Result<(), String> {
    let path = match &spec.conf {
        Some(conf) => {
            if !conf.is_file() {
                return Err(format!("{spec}: conf {} is not a file", conf.display()));
            }
            Some(c_string(spec, "conf path", &conf.display().to_string())?)
        }
        None => None,
    };
    let path_ptr = path.as_ref().map_or(std::ptr::null(), |p| p.as_ptr());
    // SAFETY: a handle that has not connected; the path is NUL-terminated or null (the default
    // search list).
    let rc = unsafe { (handles.api.rados_conf_read_file)(handles.cluster, path_ptr) };
    if rc < 0 {
        return Err(match &spec.conf {
            Some(conf) => format!("{spec}: cannot read conf {}: {}", conf.display(), errno_text(rc)),
            None => format!(
                "{spec}: no ceph.conf found (looked at $CEPH_CONF{}, /etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf); \
                 name one with ?conf=PATH",
                std::env::var("CEPH_CONF").map(|v| format!(" = {v}")).unwrap_or_else(|_| " (unset)".into())
            ),
        });
    }
    // SAFETY: as above; a null variable name means CEPH_ARGS, as the ceph tools read it.
    unsafe { (handles.api.rados_conf_parse_env)(handles.cluster, std::ptr::null()) };
    Ok(())
}

/// Sets `option` to `value` if it still has librados' default `default` (the conf left it).
fn set_default(handles: &Handles, option: &str, default: f64, value: &str) {
    if get(handles, option).and_then(|v| v.parse::<f64>().ok()) == Some(default) {
        set(handles, option, value);
    }
}

fn set(handles: &Handles, option: &str, value: &str) {
    let (Ok(option_c), Ok(value_c)) = (CString::new(option), CString::new(value)) else { return };
    // SAFETY: a handle that has not connected; both strings NUL-terminated and live.
    let rc = unsafe { (handles.api.rados_conf_set)(handles.cluster, option_c.as_ptr(), value_c.as_ptr()) };
    if rc < 0 {
        tracing::warn!(option, value, error = %errno_text(rc), "librados refused an option");
    }
}

fn get(handles: &Handles, option: &str) -> Option<String> {
    let option = CString::new(option).ok()?;
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer is live and its length is passed; librados NUL-terminates within it.
    let rc = unsafe { (handles.api.rados_conf_get)(handles.cluster, option.as_ptr(), buf.as_mut_ptr(), buf.len()) };
    if rc < 0 {
        return None;
    }
    // SAFETY: librados wrote a NUL-terminated string into `buf` (rc 0).
    let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(text.to_string_lossy().into_owned())
}
