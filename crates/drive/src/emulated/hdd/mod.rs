//! The hard-disk timing model: one head assembly that serves one media access at a time, a
//! queue it reorders by positioning time, a read look-ahead segment and a write-back cache.
//!
//! Decisions happen in time order. Whenever the drive is free and commands wait, it picks among
//! the first `queue_depth` of them (those that have arrived) the one whose data it can start
//! transferring soonest: seek from where the head is, then rotation until the first sector comes
//! round (shortest positioning time first, as NCQ/TCQ firmware does); destages from the write
//! cache compete the same way. A host command that waited more than `STARVATION_NS` goes first
//! whatever its position. `decide_until(horizon)` takes every
//! decision due by `horizon`, so the same code serves the simulator's virtual clock and a real
//! one: with either, a command that finds the drive busy waits in the queue until the drive is
//! free and chooses, so commands queued together are reordered as NCQ would (see the module
//! above for how the completion reaches its context then).
//!
//! The caches, as drives implement them:
//! - *Read look-ahead*: after a read from the platter the head keeps reading on into one segment
//!   for as long as the drive has nothing else to do. A read that the segment already holds
//!   completes from the buffer; one that starts inside it, or ahead of the head but short of
//!   the segment's end, while the head is still streaming completes when the stream reaches its
//!   end (a RAID5 member skipping its parity strip waits for the head, not a revolution). Any
//!   other access stops the stream. A segment holds twice the look-ahead: a long stream keeps
//!   its last stretch, not all it read. The cache keeps the segments of the last few streams
//!   (`read_segments`, least recently used out), so interleaved sequential readers each find
//!   what was read ahead for them; a write drops the kept segments it overlaps.
//! - *Write-back cache*: a write completes once its data crossed the link, and becomes a destage
//!   job that the queue schedules like any command. A write that continues the destage in
//!   progress (or waiting) joins it, so sequential writes reach the platter as one stream. When
//!   dirty data would exceed the cache the write goes to the platter before it completes. A flush
//!   completes once every destage queued before it is on the platter.
//!
//! Not modelled: head switches apart from seeks, reads served from dirty write-cache data, thermal
//! recalibration, errors and retries.

use super::geometry::{Platter, SeekCurve};
use super::profiles::HddProfile;
use super::{Command, Due, TimingModel};
use crate::OpKind;
use read_ahead::ReadAhead;
use std::collections::VecDeque;

mod read_ahead;

/// After this long in the queue a command is served next whatever its position: shortest
/// positioning first alone would starve a far command behind a stream of near ones. Well above
/// the ordinary wait at full queue (32 commands × 6 ms on a 7,200 rpm drive is about 0.2 s).
const STARVATION_NS: u64 = 1_000_000_000;

/// Dirty data the drive considers at each decision: firmware sorts its whole write cache; the
/// oldest few dozen destages give nearly the same choice at a bounded cost per decision.
const DESTAGE_CANDIDATES: usize = 64;

pub(crate) struct HddConfig {
    pub(crate) capacity_bytes: u64,
    pub(crate) write_cache: bool,
    pub(crate) read_ahead: bool,
    pub(crate) queue_depth: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// A host command, whose completion is reported.
    Host,
    /// Dirty data going from the write cache to the platter; its `id` means nothing.
    Destage,
}

#[derive(Clone, Copy, Debug)]
struct Job {
    origin: Origin,
    command: Command,
}

impl Job {
    fn end_bytes(&self) -> u64 {
        self.command.offset_bytes + self.command.len_bytes
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Served from the read-ahead buffer; the head is not involved.
    Buffer,
    /// Served from a kept segment (an earlier stream's); neither the head nor the stream it is
    /// reading ahead for is involved.
    Kept,
    /// The head is reading on through the data already; the command waits for it to pass.
    Stream,
    /// Seek, rotation, transfer.
    Media,
}

#[derive(Clone, Copy, Debug)]
struct Plan {
    access: Access,
    /// When data starts moving: the decision time plus the positioning time.
    transfer_start_ns: f64,
    end_ns: u64,
}

/// The last access that moved the head: a destage may still grow while the head is on it.
#[derive(Clone, Copy, Debug)]
struct LastAccess {
    origin: Origin,
    end_bytes: u64,
    end_ns: u64,
}

pub(crate) struct HddModel {
    platter: Platter,
    track_count: f64,
    read_seek: SeekCurve,
    write_seek: SeekCurve,
    command_overhead_ns: u64,
    interface_ns_per_byte: f64,
    /// 0 when the write cache is off.
    write_cache_bytes: u64,
    /// 0 when read look-ahead is off.
    read_ahead_bytes: u64,
    /// Segments kept besides the one being read ahead.
    kept_segments_max: usize,
    queue_depth: usize,
    capacity_bytes: u64,

    /// Commands and destage jobs not decided yet, in arrival order.
    pending: VecDeque<Job>,
    flushes_waiting: Vec<Command>,
    free_at_ns: u64,
    /// Where the last access left the head (the read-ahead moves it on from there).
    head_bytes: u64,
    read_ahead: Option<ReadAhead>,
    /// Earlier look-ahead segments as `[start, end)` byte ranges, most recently used last.
    kept_segments: VecDeque<(u64, u64)>,
    last_access: Option<LastAccess>,
    /// Decided destages as (end, bytes), in decision order, so with ends rising.
    destaging: VecDeque<(u64, u64)>,
    destaging_bytes: u64,
    pending_destage_bytes: u64,
    /// When the latest decided destage reaches the platter.
    destaged_by_ns: u64,
}

impl HddModel {
    pub(crate) fn new(profile: &HddProfile, config: &HddConfig) -> HddModel {
        assert!(config.queue_depth > 0);
        let platter = Platter::new(profile.rpm, profile.outer_mb_per_s, profile.inner_mb_per_s, config.capacity_bytes);
        HddModel {
            track_count: platter.track_count(),
            platter,
            read_seek: SeekCurve::new(&profile.read_seek),
            write_seek: SeekCurve::new(&profile.write_seek),
            command_overhead_ns: (profile.command_overhead_us * 1e3) as u64,
            interface_ns_per_byte: 1e3 / profile.interface_mb_per_s,
            write_cache_bytes: if config.write_cache { profile.write_cache_bytes } else { 0 },
            read_ahead_bytes: if config.read_ahead { profile.read_ahead_bytes } else { 0 },
            kept_segments_max: if config.read_ahead { profile.read_segments.saturating_sub(1) } else { 0 },
            queue_depth: config.queue_depth,
            capacity_bytes: config.capacity_bytes,
            pending: VecDeque::new(),
            flushes_waiting: Vec::new(),
            free_at_ns: 0,
            head_bytes: 0,
            read_ahead: None,
            kept_segments: VecDeque::new(),
            last_access: None,
            destaging: VecDeque::new(),
            destaging_bytes: 0,
            pending_destage_bytes: 0,
            destaged_by_ns: 0,
        }
    }

    fn link_ns(&self, len_bytes: u64) -> u64 {
        (len_bytes as f64 * self.interface_ns_per_byte).ceil() as u64
    }

    /// The command's data can move once the drive decoded it and the drive is free.
    fn ready_ns(&self, job: &Job, at_ns: u64) -> u64 {
        match job.origin {
            Origin::Host => at_ns.max(job.command.arrival_ns + self.command_overhead_ns),
            Origin::Destage => at_ns,
        }
    }

    // --- Arrival ---------------------------------------------------------------------------

    fn arrive_flush(&mut self, command: Command, decided: &mut Vec<Due>) {
        if self.pending_destage_bytes == 0 {
            let due_ns = (command.arrival_ns + self.command_overhead_ns).max(self.destaged_by_ns);
            decided.push(Due { id: command.id, due_ns });
        } else {
            self.flushes_waiting.push(command);
        }
    }

    /// Once no destage waits, every waiting flush is done when the last destage is.
    fn release_flushes(&mut self, decided: &mut Vec<Due>) {
        if self.pending_destage_bytes > 0 {
            return;
        }
        for command in self.flushes_waiting.drain(..) {
            let due_ns = (command.arrival_ns + self.command_overhead_ns).max(self.destaged_by_ns);
            decided.push(Due { id: command.id, due_ns });
        }
    }

    /// A read the look-ahead buffer holds whole completes without the head.
    fn try_buffer_read(&mut self, command: Command, decided: &mut Vec<Due>) -> bool {
        let at_ns = command.arrival_ns;
        let end_bytes = command.offset_bytes + command.len_bytes;
        let in_stream = self.read_ahead.as_ref().is_some_and(|read_ahead| {
            read_ahead.holds_start_of(&self.platter, &command, at_ns) && read_ahead.held_end_bytes(&self.platter, at_ns) >= end_bytes
        });
        if !in_stream && !self.use_kept_segment(command.offset_bytes, end_bytes) {
            return false;
        }
        let due_ns = at_ns + self.command_overhead_ns + self.link_ns(command.len_bytes);
        decided.push(Due { id: command.id, due_ns });
        if in_stream {
            self.keep_reading_ahead(&command, at_ns);
        }
        true
    }

    /// Whether a kept segment holds `[start, end)` whole; if so it becomes the most recent.
    fn use_kept_segment(&mut self, start_bytes: u64, end_bytes: u64) -> bool {
        let Some(index) = self.kept_segments.iter().position(|&(s, e)| s <= start_bytes && end_bytes <= e) else {
            return false;
        };
        let segment = self.kept_segments.remove(index).expect("found above");
        self.kept_segments.push_back(segment);
        true
    }

    /// The stream being read ahead stops for good: what it read stays in a kept segment.
    fn keep_segment(&mut self, at_ns: u64) {
        let Some(read_ahead) = self.read_ahead.take() else { return };
        let end_bytes = read_ahead.held_end_bytes(&self.platter, at_ns);
        let start_bytes = read_ahead.held_start_bytes(&self.platter, at_ns);
        if self.kept_segments_max == 0 || end_bytes <= start_bytes {
            return;
        }
        if self.kept_segments.len() == self.kept_segments_max {
            self.kept_segments.pop_front();
        }
        self.kept_segments.push_back((start_bytes, end_bytes));
    }

    /// A write makes what kept segments hold of its range stale.
    fn drop_kept_segments(&mut self, start_bytes: u64, end_bytes: u64) {
        self.kept_segments.retain(|&(s, e)| e <= start_bytes || end_bytes <= s);
    }

    /// A write the cache has room for completes once its data crossed the link.
    fn try_cache_write(&mut self, command: Command, decided: &mut Vec<Due>) -> bool {
        if self.dirty_bytes(command.arrival_ns) + command.len_bytes > self.write_cache_bytes {
            return false;
        }
        let due_ns = command.arrival_ns + self.command_overhead_ns + self.link_ns(command.len_bytes);
        decided.push(Due { id: command.id, due_ns });
        self.queue_destage(command);
        true
    }

    fn dirty_bytes(&mut self, at_ns: u64) -> u64 {
        while let Some(&(end_ns, bytes)) = self.destaging.front() {
            if end_ns > at_ns {
                break;
            }
            self.destaging.pop_front();
            self.destaging_bytes -= bytes;
        }
        self.destaging_bytes + self.pending_destage_bytes
    }

    fn queue_destage(&mut self, command: Command) {
        self.pending_destage_bytes += command.len_bytes;
        if let Some(last) = self.pending.back_mut() {
            if last.origin == Origin::Destage && last.end_bytes() == command.offset_bytes {
                last.command.len_bytes += command.len_bytes;
                return;
            }
        }
        if self.pending.is_empty() && self.try_extend_destage(&command) {
            self.pending_destage_bytes -= command.len_bytes;
            return;
        }
        let command = Command { kind: OpKind::Write, ..command };
        self.pending.push_back(Job { origin: Origin::Destage, command });
    }

    /// Data that continues the destage the head is still writing is written on without a new
    /// positioning. Nothing is decided after that destage, so only its own end moves.
    fn try_extend_destage(&mut self, command: &Command) -> bool {
        let Some(last) = &mut self.last_access else { return false };
        if last.origin != Origin::Destage || last.end_bytes != command.offset_bytes || command.arrival_ns >= last.end_ns {
            return false;
        }
        debug_assert_eq!(self.free_at_ns, last.end_ns, "nothing was decided after the destage");
        let transfer_ns = self.platter.transfer_ns(command.offset_bytes, command.len_bytes).ceil() as u64;
        last.end_bytes += command.len_bytes;
        last.end_ns += transfer_ns;
        self.free_at_ns = last.end_ns;
        self.head_bytes = last.end_bytes;
        self.destaged_by_ns = last.end_ns;
        let back = self.destaging.back_mut().expect("the last access was a decided destage");
        *back = (last.end_ns, back.1 + command.len_bytes);
        self.destaging_bytes += command.len_bytes;
        true
    }

    // --- Decisions --------------------------------------------------------------------------

    /// Shortest positioning time first among the first `queue_depth` host commands and the first
    /// `DESTAGE_CANDIDATES` destages that have arrived, unless a host command waited too long.
    fn pick(&self, at_ns: u64) -> usize {
        if let Some(index) = self.starving_host_command(at_ns) {
            return index;
        }
        let (mut host_left, mut destage_left) = (self.queue_depth, DESTAGE_CANDIDATES);
        let mut best: Option<(usize, f64)> = None;
        for (index, job) in self.pending.iter().enumerate() {
            if job.command.arrival_ns > at_ns || (host_left == 0 && destage_left == 0) {
                break;
            }
            let left = match job.origin {
                Origin::Host => &mut host_left,
                Origin::Destage => &mut destage_left,
            };
            if *left == 0 {
                continue;
            }
            *left -= 1;
            let positioning_ns = self.plan(job, at_ns).transfer_start_ns - at_ns as f64;
            if best.is_none_or(|(_, best_ns)| positioning_ns < best_ns) {
                best = Some((index, positioning_ns));
            }
        }
        best.expect("the oldest job has arrived").0
    }

    /// Destages have no one waiting: only host commands age.
    fn starving_host_command(&self, at_ns: u64) -> Option<usize> {
        let (index, oldest) = self.pending.iter().enumerate().find(|(_, job)| job.origin == Origin::Host)?;
        (at_ns.saturating_sub(oldest.command.arrival_ns) > STARVATION_NS).then_some(index)
    }

    fn plan(&self, job: &Job, at_ns: u64) -> Plan {
        if job.origin == Origin::Host && job.command.kind == OpKind::Read {
            if let Some(plan) = self.plan_from_read_ahead(job, at_ns) {
                return plan;
            }
        }
        self.plan_media(job, at_ns)
    }

    fn plan_from_read_ahead(&self, job: &Job, at_ns: u64) -> Option<Plan> {
        let (start_bytes, end_bytes) = (job.command.offset_bytes, job.end_bytes());
        if self.kept_segments.iter().any(|&(s, e)| s <= start_bytes && end_bytes <= e) {
            let ready_ns = self.ready_ns(job, at_ns);
            return Some(Plan {
                access: Access::Kept,
                transfer_start_ns: ready_ns as f64,
                end_ns: ready_ns + self.link_ns(job.command.len_bytes),
            });
        }
        let read_ahead = self.read_ahead.as_ref()?;
        let ready_ns = self.ready_ns(job, at_ns);
        if read_ahead.holds_start_of(&self.platter, &job.command, at_ns)
            && job.end_bytes() <= read_ahead.held_end_bytes(&self.platter, at_ns)
        {
            let end_ns = ready_ns + self.link_ns(job.command.len_bytes);
            return Some(Plan { access: Access::Buffer, transfer_start_ns: ready_ns as f64, end_ns });
        }
        if !read_ahead.will_hold_start_of(&self.platter, &job.command, at_ns) {
            return None;
        }
        let streamed_ns = self.platter.transfer_ns(read_ahead.stream_from_bytes, job.end_bytes() - read_ahead.stream_from_bytes);
        let end_ns = ready_ns.max(read_ahead.stream_start_ns + streamed_ns.ceil() as u64);
        let transfer_start_ns = (at_ns as f64).max(read_ahead.reaches_ns(&self.platter, job.command.offset_bytes));
        Some(Plan { access: Access::Stream, transfer_start_ns, end_ns })
    }

    fn plan_media(&self, job: &Job, at_ns: u64) -> Plan {
        let command = &job.command;
        let free_ns = self.head_free_ns(at_ns);
        let head_position = self.platter.track_position(self.head_bytes_at(free_ns)).floor();
        let target_position = self.platter.track_position(command.offset_bytes).floor();
        let curve = if command.kind == OpKind::Write { &self.write_seek } else { &self.read_seek };
        let seek_ns = curve.seek_ns((head_position - target_position).abs(), self.track_count);
        let on_track_ns = self.ready_ns(job, free_ns) as f64 + seek_ns;
        let transfer_start_ns = on_track_ns + self.platter.rotational_wait_ns(on_track_ns, command.offset_bytes);
        let end_ns = transfer_start_ns + self.platter.transfer_ns(command.offset_bytes, command.len_bytes);
        Plan { access: Access::Media, transfer_start_ns, end_ns: end_ns.ceil() as u64 }
    }

    /// When the head may leave the stream it reads ahead for: not before a detected stream's
    /// minimum prefetch is in the segment. Drives read a minimum prefetch before they switch
    /// (the caching mode page's field of that name; adaptive segmentation in practice), so
    /// interleaved sequential readers each get a segment's worth per visit instead of paying a
    /// seek and a rotation for every request.
    fn head_free_ns(&self, at_ns: u64) -> u64 {
        match &self.read_ahead {
            Some(read_ahead) if read_ahead.stopped_ns == u64::MAX => at_ns.max(read_ahead.prefetched_ns(&self.platter)),
            _ => at_ns,
        }
    }

    /// Whether a read at `offset_bytes` continues data the drive read ahead: the start of a
    /// stream, whose segment then gets a minimum prefetch.
    fn continues_a_stream(&self, offset_bytes: u64, at_ns: u64) -> bool {
        let in_current = self.read_ahead.as_ref().is_some_and(|read_ahead| {
            read_ahead.held_start_bytes(&self.platter, at_ns) <= offset_bytes
                && offset_bytes <= read_ahead.held_end_bytes(&self.platter, at_ns)
        });
        in_current || self.kept_segments.iter().any(|&(start, end)| start <= offset_bytes && offset_bytes <= end)
    }

    /// The head reads ahead from where the last read left it, as long as nothing else moved it.
    fn head_bytes_at(&self, at_ns: u64) -> u64 {
        match &self.read_ahead {
            Some(read_ahead) if read_ahead.stopped_ns == u64::MAX => read_ahead.held_end_bytes(&self.platter, at_ns),
            _ => self.head_bytes,
        }
    }

    fn apply(&mut self, job: &Job, plan: &Plan, at_ns: u64, decided: &mut Vec<Due>) {
        match plan.access {
            Access::Buffer => self.keep_reading_ahead(&job.command, at_ns),
            Access::Kept => assert!(self.use_kept_segment(job.command.offset_bytes, job.end_bytes()), "planned from a kept segment"),
            Access::Stream => {
                self.keep_reading_ahead(&job.command, at_ns);
                self.free_at_ns = plan.end_ns;
                self.last_access = Some(LastAccess { origin: job.origin, end_bytes: job.end_bytes(), end_ns: plan.end_ns });
            }
            Access::Media => self.apply_media(job, plan, at_ns),
        }
        match job.origin {
            Origin::Host => decided.push(Due { id: job.command.id, due_ns: plan.end_ns }),
            Origin::Destage => self.destage_decided(job, plan.end_ns),
        }
    }

    fn apply_media(&mut self, job: &Job, plan: &Plan, at_ns: u64) {
        let stop_ns = self.head_free_ns(at_ns);
        let continues = self.continues_a_stream(job.command.offset_bytes, stop_ns);
        if let Some(read_ahead) = &mut self.read_ahead {
            read_ahead.stopped_ns = read_ahead.stopped_ns.min(stop_ns);
        }
        self.free_at_ns = plan.end_ns;
        self.head_bytes = job.end_bytes();
        self.last_access = Some(LastAccess { origin: job.origin, end_bytes: job.end_bytes(), end_ns: plan.end_ns });
        if job.command.kind == OpKind::Read && self.read_ahead_bytes > 0 {
            self.keep_segment(stop_ns);
            let limit_bytes = (job.end_bytes() + self.read_ahead_bytes).min(self.capacity_bytes);
            self.read_ahead = Some(ReadAhead {
                segment_start_bytes: job.command.offset_bytes,
                segment_bytes: 2 * self.read_ahead_bytes,
                stream_from_bytes: job.end_bytes(),
                stream_start_ns: plan.end_ns,
                limit_bytes,
                stopped_ns: u64::MAX,
                prefetch_to_bytes: if continues { limit_bytes } else { job.end_bytes() },
            });
        }
    }

    /// A host reading on sequentially keeps the segment a full look-ahead in front of it.
    /// `command` is a read the current segment served (or the head is streaming into).
    fn keep_reading_ahead(&mut self, command: &Command, at_ns: u64) {
        // A read served elsewhere (a kept segment) must not move this stream: its end may be
        // anywhere on the disk, and the head would read ahead all the way to it.
        assert!(
            self.read_ahead
                .as_ref()
                .is_some_and(|r| r.holds_start_of(&self.platter, command, at_ns) || r.will_hold_start_of(&self.platter, command, at_ns)),
            "only a read the current segment holds (or will hold) the start of keeps it reading ahead"
        );
        let end_bytes = command.offset_bytes + command.len_bytes;
        let capacity_bytes = self.capacity_bytes;
        let read_ahead_bytes = self.read_ahead_bytes;
        let streaming = self.read_ahead.as_ref().is_some_and(|r| r.is_streaming(&self.platter, at_ns));
        if let (true, Some(read_ahead)) = (streaming, &mut self.read_ahead) {
            read_ahead.limit_bytes = read_ahead.limit_bytes.max((end_bytes + read_ahead_bytes).min(capacity_bytes));
            // A read served by the stream proves it sequential: it gets its minimum prefetch,
            // once per visit of the head (moved on with every hit, it would keep the head from
            // other streams for as long as this one reads).
            if read_ahead.prefetch_to_bytes <= read_ahead.stream_from_bytes {
                read_ahead.prefetch_to_bytes = (end_bytes + read_ahead_bytes).min(capacity_bytes);
            }
        }
    }

    fn destage_decided(&mut self, job: &Job, end_ns: u64) {
        self.pending_destage_bytes -= job.command.len_bytes;
        self.destaging.push_back((end_ns, job.command.len_bytes));
        self.destaging_bytes += job.command.len_bytes;
        self.destaged_by_ns = self.destaged_by_ns.max(end_ns);
    }
}

impl TimingModel for HddModel {
    fn arrive(&mut self, command: Command, decided: &mut Vec<Due>) {
        let served_at_once = match command.kind {
            OpKind::Flush => {
                self.arrive_flush(command, decided);
                true
            }
            OpKind::Write => {
                self.drop_kept_segments(command.offset_bytes, command.offset_bytes + command.len_bytes);
                self.try_cache_write(command, decided)
            }
            OpKind::Read => self.try_buffer_read(command, decided),
        };
        if !served_at_once {
            self.pending.push_back(Job { origin: Origin::Host, command });
        }
    }

    fn decide_until(&mut self, horizon_ns: u64, decided: &mut Vec<Due>) {
        while let Some(at_ns) = self.next_decision_ns() {
            if at_ns > horizon_ns {
                break;
            }
            let index = self.pick(at_ns);
            let job = self.pending.remove(index).expect("picked from the queue");
            let plan = self.plan(&job, at_ns);
            debug_assert!(plan.end_ns >= at_ns);
            self.apply(&job, &plan, at_ns, decided);
            self.release_flushes(decided);
        }
    }

    fn next_decision_ns(&self) -> Option<u64> {
        self.pending.front().map(|job| job.command.arrival_ns.max(self.free_at_ns))
    }
}
