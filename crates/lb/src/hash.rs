//! The one hash function every braid balancer uses, so that two instances with the same backends
//! agree on every decision (Maglev permutations, flow hashes, source hashing).
//!
//! Definition (fixed, documented, never `RandomState`): FNV-1a 64 over the bytes, starting from the
//! FNV offset basis XOR `seed`, then the MurmurHash3 `fmix64` finalizer so that inputs differing in
//! one byte (addresses, ports) spread over all 64 bits.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Seed of Maglev's `offset` hash (h1 in the paper).
pub const SEED_MAGLEV_OFFSET: u64 = 0x6d61_676c_6576_6f66; // "maglevof"
/// Seed of Maglev's `skip` hash (h2 in the paper).
pub const SEED_MAGLEV_SKIP: u64 = 0x6d61_676c_6576_736b; // "maglevsk"
/// Seed of the flow (5-tuple) hash.
pub const SEED_FLOW: u64 = 0x666c_6f77_6861_7368; // "flowhash"
/// Seed of the client-address hash.
pub const SEED_CLIENT: u64 = 0x636c_6965_6e74_6866; // "clienthf"
/// Seed of the rendezvous (highest random weight) scores.
pub const SEED_RENDEZVOUS: u64 = 0x7265_6e64_657a_766f; // "rendezvo"

/// MurmurHash3's 64-bit finalizer: a bijection with full avalanche.
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// Seeded FNV-1a 64 + `fmix64` (see the module doc).
pub fn hash_bytes(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET ^ seed;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    fmix64(h)
}

/// Combines two hashes (order matters).
pub fn combine(a: u64, b: u64) -> u64 {
    fmix64(a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_values_do_not_change() {
        // Balancer instances (and versions) must agree: these values are part of the contract.
        assert_eq!(hash_bytes(0, b""), fmix64(FNV_OFFSET));
        let a = hash_bytes(SEED_FLOW, b"198.18.0.3:8080");
        assert_eq!(a, hash_bytes(SEED_FLOW, b"198.18.0.3:8080"));
        assert_ne!(a, hash_bytes(SEED_FLOW, b"198.18.0.4:8080"));
        assert_ne!(a, hash_bytes(SEED_CLIENT, b"198.18.0.3:8080"));
    }

    #[test]
    fn one_byte_change_flips_about_half_the_bits() {
        let mut total = 0u32;
        for i in 0..256u32 {
            let a = hash_bytes(SEED_FLOW, &[10, 0, 0, i as u8]);
            let b = hash_bytes(SEED_FLOW, &[10, 0, 1, i as u8]);
            total += (a ^ b).count_ones();
        }
        let mean = f64::from(total) / 256.0;
        assert!((28.0..36.0).contains(&mean), "mean flipped bits {mean}");
    }
}
