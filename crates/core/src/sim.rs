//! Deterministic network simulator (virtual time, seeded RNG). (Being written.)
