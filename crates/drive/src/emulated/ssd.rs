//! The SSD timing model: parallel flash units behind one controller.
//!
//! An operation takes a free unit (channel or die group) for its latency, and a slot on the
//! controller pipeline for `max(1 / IOPS ceiling, bytes / bandwidth)`; it completes when both are
//! done. At queue depth 1 that is the datasheet latency; with many operations queued the pipeline
//! is the limit, which is the datasheet's IOPS or MB/s. Writes switch to the steady-state figures
//! once more than the spare area has been written, and stay there (no TRIM, no idle recovery).
//! Flash has no position to optimise for, so every operation is decided when it arrives.

use super::profiles::{SsdFigures, SsdProfile};
use super::{Command, Due, TimingModel};
use crate::OpKind;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One kind of operation, in the units the model computes in.
#[derive(Clone, Copy, Debug)]
struct OpCost {
    latency_ns: u64,
    pipeline_ns_per_op: f64,
    pipeline_ns_per_byte: f64,
}

impl OpCost {
    fn new(figures: &SsdFigures) -> OpCost {
        OpCost {
            latency_ns: (figures.latency_us * 1e3) as u64,
            pipeline_ns_per_op: 1e9 / figures.iops_4k,
            pipeline_ns_per_byte: 1e3 / figures.mb_per_s,
        }
    }

    fn pipeline_ns(&self, len_bytes: u64) -> u64 {
        self.pipeline_ns_per_op.max(len_bytes as f64 * self.pipeline_ns_per_byte).ceil() as u64
    }
}

pub(crate) struct SsdModel {
    read: OpCost,
    write_fresh: OpCost,
    write_steady: OpCost,
    steady_after_bytes: u64,
    written_bytes: u64,
    units_free_ns: Vec<u64>,
    pipeline_free_ns: u64,
    queue_depth: usize,
    /// Completion times of the operations the drive holds, earliest first.
    in_drive_due_ns: BinaryHeap<Reverse<u64>>,
    last_write_due_ns: u64,
}

impl SsdModel {
    pub(crate) fn new(profile: &SsdProfile, steady_after_bytes: u64, queue_depth: usize) -> SsdModel {
        assert!(profile.parallel_units > 0 && queue_depth > 0);
        SsdModel {
            read: OpCost::new(&profile.read),
            write_fresh: OpCost::new(&profile.write_fresh),
            write_steady: OpCost::new(&profile.write_steady),
            steady_after_bytes,
            written_bytes: 0,
            units_free_ns: vec![0; profile.parallel_units],
            pipeline_free_ns: 0,
            queue_depth,
            in_drive_due_ns: BinaryHeap::new(),
            last_write_due_ns: 0,
        }
    }

    fn write_cost(&self) -> OpCost {
        if self.written_bytes > self.steady_after_bytes {
            self.write_steady
        } else {
            self.write_fresh
        }
    }

    /// When the drive has room for a command arriving at `arrival_ns`: beyond its queue depth a
    /// command waits in the host for the earliest one to complete.
    fn admitted_ns(&mut self, arrival_ns: u64) -> u64 {
        while self.in_drive_due_ns.peek().is_some_and(|Reverse(due)| *due <= arrival_ns) {
            self.in_drive_due_ns.pop();
        }
        if self.in_drive_due_ns.len() < self.queue_depth {
            return arrival_ns;
        }
        let Reverse(first_free_ns) = self.in_drive_due_ns.pop().expect("the queue is full");
        first_free_ns.max(arrival_ns)
    }

    fn serve(&mut self, command: &Command) -> u64 {
        let cost = if command.kind == OpKind::Write { self.write_cost() } else { self.read };
        let admitted_ns = self.admitted_ns(command.arrival_ns);
        let (unit, unit_free_ns) = self.units_free_ns.iter().copied().enumerate().min_by_key(|&(_, free)| free).expect("units");
        let start_ns = admitted_ns.max(unit_free_ns);
        self.pipeline_free_ns = start_ns.max(self.pipeline_free_ns) + cost.pipeline_ns(command.len_bytes);
        let due_ns = (start_ns + cost.latency_ns).max(self.pipeline_free_ns);
        self.units_free_ns[unit] = due_ns;
        self.in_drive_due_ns.push(Reverse(due_ns));
        if command.kind == OpKind::Write {
            self.written_bytes += command.len_bytes;
            self.last_write_due_ns = self.last_write_due_ns.max(due_ns);
        }
        debug_assert!(due_ns > command.arrival_ns);
        due_ns
    }

    /// Power-loss protection makes the write buffer durable: a flush only waits for the writes
    /// before it, plus one trip through the controller.
    fn flush_due_ns(&self, command: &Command) -> u64 {
        (command.arrival_ns + self.write_fresh.latency_ns).max(self.last_write_due_ns)
    }
}

impl TimingModel for SsdModel {
    fn arrive(&mut self, command: Command, decided: &mut Vec<Due>) {
        let due_ns = match command.kind {
            OpKind::Flush => self.flush_due_ns(&command),
            OpKind::Read | OpKind::Write => self.serve(&command),
        };
        decided.push(Due { id: command.id, due_ns });
    }

    fn decide_until(&mut self, _horizon_ns: u64, _decided: &mut Vec<Due>) {}

    fn next_decision_ns(&self) -> Option<u64> {
        None
    }
}
