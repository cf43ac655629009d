//! Keys of a realistic shape for the measuring examples, made from a counter so that a
//! measurement holds no key list.

/// Key `i` in a realistic shape: 16 bytes are a binary UUID, 36 bytes its text form
/// (`8-4-4-4-12` hex digits). Written into `buf`, so the measurement holds no key list.
pub fn make_key(i: u64, buf: &mut [u8]) -> &[u8] {
    let hi = splitmix(i);
    let lo = splitmix(i ^ 0x5851_f42d_4c95_7f2d);
    let raw = ((u128::from(hi)) << 64 | u128::from(lo)).to_be_bytes();
    if buf.len() == 16 {
        buf.copy_from_slice(&raw);
    } else {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut at = 0;
        for (j, byte) in raw.iter().enumerate() {
            if matches!(j, 4 | 6 | 8 | 10) {
                buf[at] = b'-';
                at += 1;
            }
            buf[at] = HEX[usize::from(byte >> 4)];
            buf[at + 1] = HEX[usize::from(byte & 0x0f)];
            at += 2;
        }
    }
    buf
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
