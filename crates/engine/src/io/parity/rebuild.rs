//! Rebuilding the strips of one or two members of parity rows, row by row or in runs.

use super::*;

/// Reconstructs the strips (data, P or Q) that `targets` hold in the row and writes them, with
/// read repair of source strips that failed a read. Where more is lost than the span tolerates,
/// the lost chunks of data strips become bad blocks (recorded durably first) holding zeros, and
/// P and Q are recomputed with them, so that the row stays consistent for later writes.
pub(super) async fn parity_rebuild_row(env: &Env, row: &Row, targets: MemberSet) -> Result<(), VdError> {
    if !row.span_members().iter().any(|&(member, _)| targets.contains(member)) {
        return Ok(());
    }
    refuse_unsynced(env, row, targets)?;
    let strips = lost::read_strips(env, &strip_places(row), env.vd.unavailable().union(targets)).await;
    let writes = rebuilt_strips(env, row, targets, strips).await?;
    write_strips(env, row.map.row, writes, "writing the rebuilt strip to").await
}

/// [`parity_rebuild_row`] of a run of locked rows, with each member's part of the run read and
/// written in as few I/Os as the layout allows (see `run`). A failed read sends the rows down
/// the row path one by one.
pub(super) async fn parity_rebuild_rows(env: &Env, rows: &[Row], targets: MemberSet) -> Vec<Result<(), VdError>> {
    // Rows of other spans (RAID50/60) hold nothing of the targets: nothing to read or write.
    let wanted: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].span_members().iter().any(|&(m, _)| targets.contains(m))).collect();
    let places: Vec<Vec<(usize, u64)>> = wanted.iter().map(|&i| strip_places(&rows[i])).collect();
    let flat: Vec<(usize, u64)> = places.iter().flatten().copied().collect();
    let mut results: Vec<Result<(), VdError>> = rows.iter().map(|_| Ok(())).collect();
    let Some(strips) = run::read_strips(env, &flat, env.vd.unavailable().union(targets)).await else {
        for &i in &wanted {
            results[i] = parity_rebuild_row(env, &rows[i], targets).await;
        }
        return results;
    };
    let mut strips = strips.into_iter();
    let mut writes = Vec::new();
    for (&i, row_places) in wanted.iter().zip(&places) {
        let row_strips: Vec<StripRead> = strips.by_ref().take(row_places.len()).collect();
        let planned = match refuse_unsynced(env, &rows[i], targets) {
            Ok(()) => rebuilt_strips(env, &rows[i], targets, row_strips).await,
            Err(error) => Err(error),
        };
        match planned {
            Ok(row_writes) => writes.extend(row_writes.into_iter().map(|(member, offset_bytes, buf)| (i, member, offset_bytes, buf))),
            Err(error) => results[i] = Err(error),
        }
    }
    let row_numbers: Vec<u64> = rows.iter().map(|row| row.map.row).collect();
    let written = run::write_strips(env, &row_numbers, writes, "writing the rebuilt strip to").await;
    results.into_iter().zip(written).map(|(planned, written)| planned.and(written)).collect()
}

/// Where a row's strips are: (member, drive offset) of `[D0.., P, (Q)]`.
fn strip_places(row: &Row) -> Vec<(usize, u64)> {
    row.span_members().iter().map(|&(member, offset_bytes)| (member, offset_bytes + row.lo)).collect()
}

/// A row whose parity may be stale after an unclean stop is not rebuilt: what it would give is
/// not known to be the data, and not known to be lost either. Left for the resync (the member
/// stays Rbld).
fn refuse_unsynced(env: &Env, row: &Row, targets: MemberSet) -> Result<(), VdError> {
    if !env.vd.write_intent().is_some_and(|intent| intent.row_unsynced(row.map.row)) {
        return Ok(());
    }
    let member =
        row.span_members().iter().map(|&(member, _)| member).find(|&member| targets.contains(member)).expect("a row with a target");
    let detail = "its region is not yet resynced (after an unclean stop) or initialized (a new VD over old data): its parity may not match"
        .to_string();
    Err(VdError::RowUnrecoverable { vd: env.vd.name(), row: row.map.row, member, detail })
}

/// From a row's strips as read (`[D0.., P, (Q)]`, targets not read), the strips to write: the
/// targets' rebuilt, and read repairs. Data nothing holds is recorded as bad blocks (durably)
/// first and written as zeros, with parity recomputed over them.
async fn rebuilt_strips(env: &Env, row: &Row, targets: MemberSet, mut strips: Vec<StripRead>) -> Result<Vec<(usize, u64, IoBuf)>, VdError> {
    let members = row.span_members();
    let target_roles: Vec<usize> = (0..members.len()).filter(|&i| targets.contains(members[i].0)).collect();
    let first_target = members[*target_roles.first().expect("a row with a target")].0;
    let kind = env.vd.geometry().span_kind();
    if strips.iter().filter(|strip| strip.state != StripState::Read).count() > kind.failures_tolerated() {
        lost::probe(env, &mut strips).await;
    }
    let m = row.map.data_strip_count();
    let lost_ranges = recover_segments(env, row, kind, &mut strips);
    if !lost_ranges.is_empty() {
        let data: Vec<&[u8]> = strips[..m].iter().map(|strip| strip.buf.as_slice()).collect();
        let (p, q) = new_parity(env, row, &data);
        strips[m].buf.as_mut_slice().copy_from_slice(p.as_slice());
        if let Some(q) = q {
            strips[m + 1].buf.as_mut_slice().copy_from_slice(q.as_slice());
        }
        let cause = lost::cause(row.map.row, targets, &strips);
        lost::record_lost(env, row.map.row, first_target, &lost_ranges, &cause).await?;
    }
    let unwritable = env.vd.unwritable();
    let rewrite = |i: usize, strip: &StripRead| {
        let repair = strip.is_unreadable() || (!lost_ranges.is_empty() && i >= m);
        target_roles.contains(&i) || (repair && !unwritable.contains(strip.member))
    };
    Ok(strips.into_iter().enumerate().filter(|(i, strip)| rewrite(*i, strip)).map(|(_, s)| (s.member, s.offset_bytes, s.buf)).collect())
}

/// Fills in the chunks of `strips` (`[D0.., P, (Q)]`) that were not read: recovered where the
/// span tolerates what is lost there, zeros in lost data strips otherwise. Runs of chunks with
/// the same losses go together, so a row without unreadable chunks is one run. Returns the lost
/// VD ranges.
fn recover_segments(env: &Env, row: &Row, kind: SpanKind, strips: &mut [StripRead]) -> Vec<BadBlock> {
    let chunk_count = lost::chunk_count(env.vd.geometry());
    let lost_at = |strips: &[StripRead], chunk: usize| -> Vec<usize> { (0..strips.len()).filter(|&i| strips[i].lost_at(chunk)).collect() };
    let m = row.map.data_strip_count();
    let mut lost_ranges = Vec::new();
    let mut first = 0;
    while first < chunk_count {
        let lost = lost_at(strips, first);
        let end = (first + 1..chunk_count).find(|&chunk| lost_at(strips, chunk) != lost).unwrap_or(chunk_count);
        if lost.len() <= kind.failures_tolerated() {
            let (a, b) = (first * PROBE_BYTES as usize, end * PROBE_BYTES as usize);
            let mut blocks: Vec<&mut [u8]> = strips.iter_mut().map(|strip| &mut strip.buf.as_mut_slice()[a..b]).collect();
            recover_blocks(kind, &mut blocks, &lost);
        } else {
            // Lost data chunks stay zeros (their buffers were zeroed); parity is recomputed.
            let geometry = env.vd.geometry();
            lost_ranges.extend(lost.iter().filter(|&&i| i < m).map(|&k| lost::lost_range(geometry, row.map.row, k, first..end)));
        }
        first = end;
    }
    lost::merged(lost_ranges)
}
