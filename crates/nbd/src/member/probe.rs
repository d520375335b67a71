//! A new connection on probation: before a reconnection goes live, the drive's owner may read
//! the export through it (as a `drive::Drive` that only reads) and refuse it. storc checks that
//! the export still holds the metadata of the same drive: the same address may now serve a
//! blank disk or another one, and writing on as if it were the member would lose data.

use crate::client::Client;
use drive::{check_op_range, Completion, Drive, DriveError, DriveInfo, DriveOp, IoCtx, Token};
use std::sync::Mutex;

/// Decides whether a reconnection may go live, from what it reads of the export; `Err` says why
/// not (the supervisor keeps trying, and [`super::LinkStatus::refused`] says so meanwhile).
pub type ReconnectCheck = Box<dyn Fn(&dyn Drive) -> Result<(), String> + Send + Sync>;

/// The connected client as a read-only drive, on the supervisor's thread (blocking reads, each
/// bounded by the link's timeout through the socket's own).
pub(super) struct Probe {
    client: Mutex<Client>,
    info: DriveInfo,
}

impl Probe {
    pub(super) fn new(client: Client, info: DriveInfo) -> Probe {
        Probe { client: Mutex::new(client), info }
    }

    pub(super) fn into_client(self) -> Client {
        self.client.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read(&self, offset_bytes: u64, bufs: &mut [drive::IoBuf]) -> Result<(), DriveError> {
        let mut client = self.client.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut at = offset_bytes;
        for buf in bufs {
            let len = u32::try_from(buf.len()).map_err(|_| DriveError::Io(libc::EINVAL))?;
            let data = client.read(at, len).map_err(|_| DriveError::Gone)?;
            buf.as_mut_slice().copy_from_slice(&data);
            at += u64::from(len);
        }
        Ok(())
    }
}

impl Drive for Probe {
    fn info(&self) -> &DriveInfo {
        &self.info
    }

    fn submit(&self, ctx: &mut IoCtx, token: Token, mut op: DriveOp) {
        if let Err(error) = check_op_range(&op, self.info.capacity_bytes) {
            return ctx.fail(token, error, op);
        }
        let result = match &mut op {
            DriveOp::Read { offset_bytes, buf } => self.read(*offset_bytes, std::slice::from_mut(buf)),
            DriveOp::ReadV { offset_bytes, bufs } => self.read(*offset_bytes, bufs),
            // On probation nothing is written: the check only looks.
            DriveOp::Write { .. } | DriveOp::WriteV { .. } | DriveOp::Flush => Err(DriveError::Io(libc::EROFS)),
        };
        ctx.complete(Completion::of(token, result, op));
    }
}
