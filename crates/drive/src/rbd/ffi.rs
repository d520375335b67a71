//! The part of librados' and librbd's C API this backend calls, loaded at run time.
//!
//! The libraries are opened with `dlopen` (through `libloading`) the first time an `rbd:` drive
//! is opened, by their sonames (`librados.so.2`, `librbd.so.1`, Debian's `librados2` and
//! `librbd1`), and stay loaded for the life of the process. So storc builds and runs without
//! them; only an `rbd:` drive needs them, and says which package to install when they are
//! missing. Every signature below is copied from Ceph 16's `rados/librados.h` and
//! `rbd/librbd.h`; these functions have had the same C ABI since librbd 1.12 (Ceph 13).

use libloading::Library;
use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

pub(crate) type RadosT = *mut c_void;
pub(crate) type RadosIoctxT = *mut c_void;
pub(crate) type RbdImageT = *mut c_void;
pub(crate) type RbdCompletionT = *mut c_void;
pub(crate) type RbdCallbackT = unsafe extern "C" fn(RbdCompletionT, *mut c_void);
pub(crate) type DiffCallbackT = unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;

/// Function pointers into the loaded libraries; valid while `_rados` and `_rbd` are loaded,
/// which is forever (the table lives in a static).
pub(crate) struct Api {
    pub(crate) rados_create2: unsafe extern "C" fn(*mut RadosT, *const c_char, *const c_char, u64) -> c_int,
    pub(crate) rados_conf_read_file: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    pub(crate) rados_conf_parse_env: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    pub(crate) rados_conf_set: unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int,
    pub(crate) rados_conf_get: unsafe extern "C" fn(RadosT, *const c_char, *mut c_char, usize) -> c_int,
    pub(crate) rados_connect: unsafe extern "C" fn(RadosT) -> c_int,
    pub(crate) rados_shutdown: unsafe extern "C" fn(RadosT),
    pub(crate) rados_ioctx_create: unsafe extern "C" fn(RadosT, *const c_char, *mut RadosIoctxT) -> c_int,
    pub(crate) rados_ioctx_destroy: unsafe extern "C" fn(RadosIoctxT),
    pub(crate) rbd_create: unsafe extern "C" fn(RadosIoctxT, *const c_char, u64, *mut c_int) -> c_int,
    pub(crate) rbd_open: unsafe extern "C" fn(RadosIoctxT, *const c_char, *mut RbdImageT, *const c_char) -> c_int,
    pub(crate) rbd_close: unsafe extern "C" fn(RbdImageT) -> c_int,
    pub(crate) rbd_get_size: unsafe extern "C" fn(RbdImageT, *mut u64) -> c_int,
    pub(crate) rbd_diff_iterate2: unsafe extern "C" fn(RbdImageT, *const c_char, u64, u64, u8, u8, DiffCallbackT, *mut c_void) -> c_int,
    pub(crate) rbd_aio_create_completion: unsafe extern "C" fn(*mut c_void, RbdCallbackT, *mut RbdCompletionT) -> c_int,
    pub(crate) rbd_aio_read: unsafe extern "C" fn(RbdImageT, u64, usize, *mut c_char, RbdCompletionT) -> c_int,
    pub(crate) rbd_aio_write: unsafe extern "C" fn(RbdImageT, u64, usize, *const c_char, RbdCompletionT) -> c_int,
    pub(crate) rbd_aio_readv: unsafe extern "C" fn(RbdImageT, *const libc::iovec, c_int, u64, RbdCompletionT) -> c_int,
    pub(crate) rbd_aio_writev: unsafe extern "C" fn(RbdImageT, *const libc::iovec, c_int, u64, RbdCompletionT) -> c_int,
    pub(crate) rbd_aio_flush: unsafe extern "C" fn(RbdImageT, RbdCompletionT) -> c_int,
    pub(crate) rbd_aio_get_return_value: unsafe extern "C" fn(RbdCompletionT) -> isize,
    pub(crate) rbd_aio_release: unsafe extern "C" fn(RbdCompletionT),
    _rados: Library,
    _rbd: Library,
}

const RADOS_SONAME: &str = "librados.so.2";
const RBD_SONAME: &str = "librbd.so.1";

/// The loaded API, or why it could not be loaded (the same answer for every caller).
pub(crate) fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    let open = |soname: &str, package: &str| {
        // SAFETY: loading runs the library's initialisers; librados and librbd are ordinary C++
        // shared libraries whose initialisers only set up their own statics.
        unsafe { Library::new(soname) }.map_err(|e| {
            format!("rbd: drives need {soname} (Debian package {package}; apt-get install {package}), which could not be loaded: {e}")
        })
    };
    let rados = open(RADOS_SONAME, "librados2")?;
    let rbd = open(RBD_SONAME, "librbd1")?;
    macro_rules! symbol {
        ($library:expr, $name:ident) => {{
            // SAFETY: the type is the C prototype of the function of that name in Ceph 16's
            // headers (copied above); the pointer is used only while the library stays loaded.
            let symbol = unsafe { $library.get(concat!(stringify!($name), "\0").as_bytes()) }
                .map_err(|e| format!("{} has no {}: {e} (Ceph 13 or later is needed)", stringify!($library), stringify!($name)))?;
            *symbol
        }};
    }
    Ok(Api {
        rados_create2: symbol!(rados, rados_create2),
        rados_conf_read_file: symbol!(rados, rados_conf_read_file),
        rados_conf_parse_env: symbol!(rados, rados_conf_parse_env),
        rados_conf_set: symbol!(rados, rados_conf_set),
        rados_conf_get: symbol!(rados, rados_conf_get),
        rados_connect: symbol!(rados, rados_connect),
        rados_shutdown: symbol!(rados, rados_shutdown),
        rados_ioctx_create: symbol!(rados, rados_ioctx_create),
        rados_ioctx_destroy: symbol!(rados, rados_ioctx_destroy),
        rbd_create: symbol!(rbd, rbd_create),
        rbd_open: symbol!(rbd, rbd_open),
        rbd_close: symbol!(rbd, rbd_close),
        rbd_get_size: symbol!(rbd, rbd_get_size),
        rbd_diff_iterate2: symbol!(rbd, rbd_diff_iterate2),
        rbd_aio_create_completion: symbol!(rbd, rbd_aio_create_completion),
        rbd_aio_read: symbol!(rbd, rbd_aio_read),
        rbd_aio_write: symbol!(rbd, rbd_aio_write),
        rbd_aio_readv: symbol!(rbd, rbd_aio_readv),
        rbd_aio_writev: symbol!(rbd, rbd_aio_writev),
        rbd_aio_flush: symbol!(rbd, rbd_aio_flush),
        rbd_aio_get_return_value: symbol!(rbd, rbd_aio_get_return_value),
        rbd_aio_release: symbol!(rbd, rbd_aio_release),
        _rados: rados,
        _rbd: rbd,
    })
}
