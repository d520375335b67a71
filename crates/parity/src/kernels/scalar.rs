//! The reference kernel set: byte-at-a-time loops over the `gf` tables, written
//! straight from the definitions (Q as a sum of g^i * D_i, not Horner's rule) so
//! that it shares no structure with the SIMD kernels it checks.

use super::{check, Kernels, TwoDataFactors};
use crate::gf;

pub(super) static KERNELS: Kernels =
    Kernels { name: "scalar", xor_gen, xor_into, pq_gen, pq_update, gf_mul_into, recover_2data, recover_data_from_q };

fn xor_gen(sources: &[&[u8]], dest: &mut [u8]) {
    check::xor_gen(sources, dest);
    dest.fill(0);
    for source in sources {
        for (d, s) in dest.iter_mut().zip(source.iter()) {
            *d ^= s;
        }
    }
}

fn xor_into(dest: &mut [u8], src: &[u8]) {
    check::same_lengths("xor_into", dest, &[("src", src)]);
    for (d, s) in dest.iter_mut().zip(src) {
        *d ^= s;
    }
}

fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    check::pq_gen(data, p, q);
    p.fill(0);
    q.fill(0);
    for (index, member) in data.iter().enumerate() {
        let coefficient = gf::pow_g(index);
        for ((p, q), d) in p.iter_mut().zip(q.iter_mut()).zip(member.iter()) {
            *p ^= d;
            *q ^= gf::mul(coefficient, *d);
        }
    }
}

fn pq_update(data_index: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
    check::data_index("pq_update", data_index);
    check::same_lengths("pq_update", p, &[("delta", delta), ("q", q)]);
    let coefficient = gf::pow_g(data_index);
    for ((p, q), d) in p.iter_mut().zip(q.iter_mut()).zip(delta) {
        *p ^= d;
        *q ^= gf::mul(coefficient, *d);
    }
}

fn gf_mul_into(c: u8, src: &[u8], dest: &mut [u8]) {
    check::same_lengths("gf_mul_into", dest, &[("src", src)]);
    for (d, s) in dest.iter_mut().zip(src) {
        *d ^= gf::mul(c, *s);
    }
}

fn recover_2data(factors: TwoDataFactors, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8]) {
    check::same_lengths("recover_2data", dx, &[("p", p), ("q", q), ("dy", dy)]);
    for (((p, q), dx), dy) in p.iter().zip(q).zip(dx.iter_mut()).zip(dy.iter_mut()) {
        let p_delta = p ^ *dx;
        let q_delta = q ^ *dy;
        *dy = gf::mul(factors.p_factor, p_delta) ^ gf::mul(factors.q_factor, q_delta);
        *dx = *dy ^ p_delta;
    }
}

fn recover_data_from_q(data_index: usize, q: &[u8], dx: &mut [u8]) {
    check::data_index("recover_data_from_q", data_index);
    check::same_lengths("recover_data_from_q", dx, &[("q", q)]);
    let factor = gf::inv(gf::pow_g(data_index));
    for (dx, q) in dx.iter_mut().zip(q) {
        *dx = gf::mul(factor, q ^ *dx);
    }
}
