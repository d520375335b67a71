//! Real things for tests, here and in other crates (never mocks): a single-node Ceph cluster
//! for RBD drives ([`CephCluster`]), and a loop device for block-device behaviour such as the
//! kernel's `O_EXCL` claim ([`LoopDevice`]).

mod ceph;
mod loop_device;

pub use ceph::{CephCluster, POOL};
pub use loop_device::LoopDevice;
