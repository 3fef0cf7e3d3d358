//! DSR frame logic (sans-I/O): ARP/NDP answers for the VIP, MAC rewrite towards the chosen backend.
