//! An export: a named block device offered to clients, and the object-safe face of its device.

use super::{transmission, ConnectionError, ServerError};
use crate::device::BlockDevice;
use crate::proto::{self, BlockSizes};
use std::fmt;
use std::sync::Arc;

/// One named block device offered to clients.
#[derive(Clone)]
pub struct Export {
    pub(super) name: String,
    description: Option<String>,
    /// What stays the same when the export is renamed; see [`Export::with_identity`].
    identity_key: Option<u64>,
    pub(super) device: Arc<dyn ErasedDevice>,
}

/// Which export a connection serves, across [`Server::set_exports`]: the key given with
/// [`Export::with_identity`], else the name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum ExportIdentity {
    Key(u64),
    Name(String),
}

impl Export {
    /// Exports `device` under `name`. Any number of exports may share one device type.
    pub fn new<D: BlockDevice>(name: impl Into<String>, device: Arc<D>) -> Export {
        Export { name: name.into(), description: None, identity_key: None, device: Arc::new(Typed(device)) }
    }

    /// Names the device behind the export independently of its name (storc passes the virtual
    /// drive's instance id). [`Server::set_exports`] ends the connections of every export whose
    /// identity is not in the new set, and keeps those of an export renamed under the same one.
    /// Without it, the name is the identity.
    pub fn with_identity(mut self, identity_key: u64) -> Export {
        self.identity_key = Some(identity_key);
        self
    }

    pub(super) fn identity(&self) -> ExportIdentity {
        match self.identity_key {
            Some(key) => ExportIdentity::Key(key),
            None => ExportIdentity::Name(self.name.clone()),
        }
    }

    /// A line for people, shown by `nbdinfo --list`.
    pub fn with_description(mut self, description: impl Into<String>) -> Export {
        self.description = Some(description.into());
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    pub fn size_bytes(&self) -> u64 {
        self.device.size_bytes()
    }

    /// The constraints advertised with NBD_INFO_BLOCK_SIZE: the device's block size but at
    /// least 512, a preferred size of at least 4 KiB, and at most 32 MiB per request.
    pub fn block_sizes(&self) -> BlockSizes {
        let min_bytes = self.device.block_size_bytes().max(proto::BLOCK_SIZE_MIN_BYTES);
        BlockSizes { min_bytes, preferred_bytes: min_bytes.max(proto::BLOCK_SIZE_PREFERRED_BYTES), max_bytes: proto::PAYLOAD_MAX_BYTES }
    }

    /// The transmission flags for this export; DF only once structured replies are negotiated.
    pub fn transmission_flags(&self, structured_replies: bool) -> u16 {
        let mut flags =
            proto::NBD_FLAG_HAS_FLAGS | proto::NBD_FLAG_SEND_FLUSH | proto::NBD_FLAG_SEND_FUA | proto::NBD_FLAG_SEND_WRITE_ZEROES;
        if self.device.supports_trim() {
            flags |= proto::NBD_FLAG_SEND_TRIM;
        }
        if self.device.flush_is_global() {
            flags |= proto::NBD_FLAG_CAN_MULTI_CONN;
        }
        if structured_replies {
            // Every read is answered with one OFFSET_DATA chunk, so "don't fragment" is free.
            flags |= proto::NBD_FLAG_SEND_DF;
        }
        flags
    }

    fn check(&self) -> Result<(), ServerError> {
        let export = || self.name.clone();
        if self.name.len() > proto::STRING_MAX_BYTES {
            return Err(ServerError::NameTooLong { name_len_bytes: self.name.len() });
        }
        let block_size_bytes = self.device.block_size_bytes();
        if !block_size_bytes.is_power_of_two() || block_size_bytes > proto::BLOCK_SIZE_MIN_LIMIT_BYTES {
            return Err(ServerError::BadBlockSize { export: export(), block_size_bytes });
        }
        let min_bytes = u64::from(self.block_sizes().min_bytes);
        let size_bytes = self.device.size_bytes();
        if !size_bytes.is_multiple_of(min_bytes) {
            return Err(ServerError::PartialBlock { export: export(), size_bytes, block_size_bytes: min_bytes });
        }
        Ok(())
    }
}

impl fmt::Debug for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Export")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("identity_key", &self.identity_key)
            .field("size_bytes", &self.device.size_bytes())
            .finish()
    }
}

/// The object-safe face of a `BlockDevice`: what the handshake needs to know, and a way into
/// the transmission phase that is compiled per device type, so the hot path has no dynamic
/// dispatch and no boxed buffers.
pub(super) trait ErasedDevice: Send + Sync {
    fn size_bytes(&self) -> u64;
    fn block_size_bytes(&self) -> u32;
    fn flush_is_global(&self) -> bool;
    fn supports_trim(&self) -> bool;
    fn serve(&self, session: transmission::Session) -> Result<(), ConnectionError>;
}

struct Typed<D>(Arc<D>);

impl<D: BlockDevice> ErasedDevice for Typed<D> {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn block_size_bytes(&self) -> u32 {
        self.0.block_size_bytes()
    }
    fn flush_is_global(&self) -> bool {
        self.0.flush_is_global()
    }
    fn supports_trim(&self) -> bool {
        self.0.supports_trim()
    }
    fn serve(&self, session: transmission::Session) -> Result<(), ConnectionError> {
        transmission::serve(Arc::clone(&self.0), session)
    }
}

/// Checks every export and that names are unique.
pub(super) fn check_exports(exports: &[Export]) -> Result<(), ServerError> {
    for (index, export) in exports.iter().enumerate() {
        export.check()?;
        if exports[..index].iter().any(|earlier| earlier.name == export.name) {
            return Err(ServerError::DuplicateExport { export: export.name.clone() });
        }
    }
    Ok(())
}
