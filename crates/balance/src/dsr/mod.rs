//! DSR mode runtime: AF_PACKET on a dedicated interface. (Being written.)
