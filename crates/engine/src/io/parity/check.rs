//! Checking parity rows against their data, and repairing what disagrees.

use super::*;

/// What the stored parity of a row says about its strips.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Finding {
    Consistent,
    /// Exactly one of the strips at these column indices (P = m, Q = m + 1) is wrong, or, for
    /// RAID5's P, the row disagrees and P is all the check can name.
    Strip(usize),
    /// RAID6: P and Q both disagree and no single data strip explains it.
    Unlocated,
}

/// Reads the whole row from every member, recomputes P (and Q) from the data and compares.
pub(super) async fn parity_check_row(env: &Env, row: &Row, mode: CheckMode) -> Result<CheckOutcome, VdError> {
    let members = row.span_members();
    require_online(env, row.map.row, members.iter().map(|&(member, _)| member))?;
    let places = check_places(row);
    let columns = read_strips(env, row.map.row, &places, "reading for a check from").await?;
    judge_and_repair(env, row, &places, columns, mode).await
}

/// The strips a check of `row` reads: every member of its span, in column order.
fn check_places(row: &Row) -> Vec<(usize, u64)> {
    row.span_members().iter().map(|&(member, offset_bytes)| (member, offset_bytes + row.lo)).collect()
}

/// [`parity_check_row`] of a run of locked rows, with each member's part of the run read in one
/// I/O per drive-contiguous range. A read that fails, or a member out of service, sends the run
/// down the row path, which names the member and books the error once.
pub(super) async fn parity_check_rows(env: &Env, rows: &[Row], mode: CheckMode) -> Vec<Result<CheckOutcome, VdError>> {
    let places: Vec<Vec<(usize, u64)>> = rows.iter().map(check_places).collect();
    let mut results = Vec::with_capacity(rows.len());
    match run::read_rows(env, &places).await {
        Some(columns) => {
            for ((row, places), columns) in rows.iter().zip(&places).zip(columns) {
                results.push(judge_and_repair(env, row, places, columns, mode).await);
            }
        }
        None => {
            for row in rows {
                results.push(parity_check_row(env, row, mode).await);
            }
        }
    }
    results
}

/// Judges a row's `columns` (read from `places`, in column order) and, when `mode` writes,
/// rewrites what disagrees.
async fn judge_and_repair(
    env: &Env,
    row: &Row,
    places: &[(usize, u64)],
    mut columns: Vec<IoBuf>,
    mode: CheckMode,
) -> Result<CheckOutcome, VdError> {
    let members = row.span_members();
    assert_eq!(columns.len(), members.len(), "one column per member of the row's span");
    let m = row.map.data_strip_count();
    let data: Vec<&[u8]> = columns[..m].iter().map(|c| c.as_slice()).collect();
    let (p, q) = new_parity(env, row, &data);
    let finding = judge(&columns, m, &p, q.as_ref());
    let mismatches = match finding {
        Finding::Consistent => vec![],
        Finding::Strip(i) if q.is_none() => vec![Mismatch::Unlocated { p_member: members[i].0, q_member: None }],
        Finding::Strip(i) => vec![Mismatch::Member { member: members[i].0, role: role_of(i, m) }],
        Finding::Unlocated => vec![Mismatch::Unlocated { p_member: members[m].0, q_member: Some(members[m + 1].0) }],
    };
    let repaired = mode.writes() && finding != Finding::Consistent;
    if repaired {
        // A resync trusts the data: whatever the syndromes locate, only parity is rewritten.
        let rewritten = match (mode, finding) {
            (CheckMode::Resync, Finding::Strip(z)) if z < m => Finding::Unlocated,
            _ => finding,
        };
        let repairs = repairs_for(rewritten, &mut columns, m, p, q);
        let writes = repairs.into_iter().map(|(i, buf)| (places[i].0, places[i].1, buf)).collect();
        write_strips(env, row.map.row, writes, "writing the repaired strip to").await?;
    }
    Ok(CheckOutcome { row: row.map.row, mismatches, repaired })
}

fn role_of(column: usize, data_strip_count: usize) -> Role {
    match column.checked_sub(data_strip_count) {
        None => Role::Data { copy: 0 },
        Some(0) => Role::P,
        Some(_) => Role::Q,
    }
}

/// Compares the stored columns `[D0.., P, (Q)]` with the parity computed from their data.
fn judge(columns: &[IoBuf], m: usize, p: &IoBuf, q: Option<&IoBuf>) -> Finding {
    assert_eq!(columns.len(), m + 1 + usize::from(q.is_some()), "one column per member of the span");
    let p_wrong = columns[m].as_slice() != p.as_slice();
    let q_wrong = q.is_some_and(|q| columns[m + 1].as_slice() != q.as_slice());
    match (p_wrong, q_wrong) {
        (false, false) => Finding::Consistent,
        (true, false) => Finding::Strip(m),
        (false, true) => Finding::Strip(m + 1),
        (true, true) => {
            let q = q.expect("Q disagrees, so the span has one");
            locate_data_error(columns, m, p, q).map_or(Finding::Unlocated, Finding::Strip)
        }
    }
}

/// RAID6: the data strip `z` whose error explains both syndromes, if one does. With
/// dP = P ^ P' and dQ = Q ^ Q', a single wrong strip z gives dQ = g^z * dP (the RAID6 paper's
/// single-error location); `pq_update` computes dQ ^ g^z * dP without a second copy of the field.
fn locate_data_error(columns: &[IoBuf], m: usize, p: &IoBuf, q: &IoBuf) -> Option<usize> {
    let mut delta_p = IoBuf::from_slice(columns[m].as_slice());
    parity::xor_into(delta_p.as_mut_slice(), p.as_slice());
    let mut delta_q = IoBuf::from_slice(columns[m + 1].as_slice());
    parity::xor_into(delta_q.as_mut_slice(), q.as_slice());
    (0..m).find(|&z| {
        let mut unused_p = IoBuf::zeroed(delta_p.len());
        let mut rest = IoBuf::from_slice(delta_q.as_slice());
        parity::pq_update(z, delta_p.as_slice(), unused_p.as_mut_slice(), rest.as_mut_slice());
        rest.as_slice().iter().all(|&byte| byte == 0)
    })
}

/// The columns a repair writes, by column index: the wrong data strip rebuilt from P, or the
/// parity recomputed from the data.
fn repairs_for(finding: Finding, columns: &mut [IoBuf], m: usize, p: IoBuf, q: Option<IoBuf>) -> Vec<(usize, IoBuf)> {
    match finding {
        Finding::Consistent => unreachable!("nothing to repair in a consistent row"),
        Finding::Strip(z) if z < m => {
            // P's difference is exactly the wrong strip's error: D_z ^= P ^ P'.
            let mut fixed = columns[z].take();
            parity::xor_into(fixed.as_mut_slice(), columns[m].as_slice());
            parity::xor_into(fixed.as_mut_slice(), p.as_slice());
            vec![(z, fixed)]
        }
        Finding::Strip(i) if i == m => vec![(m, p)],
        Finding::Strip(_) => vec![(m + 1, q.expect("a wrong Q exists"))],
        Finding::Unlocated => std::iter::once((m, p)).chain(q.map(|q| (m + 1, q))).collect(),
    }
}
