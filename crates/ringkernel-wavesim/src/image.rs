//! Pictures of the field: a colour map, and PNG / animated PNG (APNG) files written
//! without an image library (zlib "stored" blocks: larger files, no compressor to build),
//! with the matching reader for checks.

use crate::WaveGrid2D;
use ringkernel_core::{Error, Result};

/// The colour of a cell at rest.
pub const BACKGROUND: [u8; 3] = [16, 18, 28];
/// The colour of the strongest positive field.
pub const POSITIVE: [u8; 3] = [255, 196, 48];
/// The colour of the strongest negative field.
pub const NEGATIVE: [u8; 3] = [48, 132, 255];
/// The colour of a reflector.
pub const REFLECTOR: [u8; 3] = [235, 235, 235];

fn lerp(a: [u8; 3], b: [u8; 3], t: f32) -> [u8; 3] {
    let f = |x: u8, y: u8| (x as f32 + (y as f32 - x as f32) * t).round() as u8;
    [f(a[0], b[0]), f(a[1], b[1]), f(a[2], b[2])]
}

/// The colour of one cell: the field value `u` against the colour scale `1/inv`, on a
/// cell whose update coefficient `a` marks reflectors (`a == 0`) and absorbers (`a < 1`).
pub(crate) fn cell_rgb(u: f32, a: f32, inv: f32) -> [u8; 3] {
    if a == 0.0 {
        return REFLECTOR;
    }
    let mut base = BACKGROUND;
    if a < 1.0 {
        // a = 1/(1+g): tint by 1 - a.
        base[1] = base[1].saturating_add(((1.0 - a) * 400.0).min(90.0) as u8);
    }
    let v = (u * inv).clamp(-1.0, 1.0);
    if v >= 0.0 {
        lerp(base, POSITIVE, v)
    } else {
        lerp(base, NEGATIVE, -v)
    }
}

/// The field as RGB pixels (`nx × ny`, row-major, 3 bytes each): the background at rest,
/// toward [`POSITIVE`] / [`NEGATIVE`] as the field nears `±scale` (clamped beyond),
/// reflectors in [`REFLECTOR`], absorbers tinted green by their damping.
pub fn render_rgb(grid: &WaveGrid2D, scale: f32) -> Vec<u8> {
    let (nx, ny, s) = (grid.nx(), grid.ny(), grid.stride());
    let u = grid.padded();
    let (_, a, _) = grid.coefficients();
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut out = Vec::with_capacity(nx * ny * 3);
    for y in 1..=ny {
        for x in 1..=nx {
            let k = y * s + x;
            out.extend_from_slice(&cell_rgb(u[k], a[k], inv));
        }
    }
    out
}

fn crc32(parts: &[&[u8]]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    let mut c = !0u32;
    for p in parts {
        for &b in *p {
            c = t[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8);
        }
    }
    !c
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += x as u32;
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    (b << 16) | a
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    out.extend_from_slice(&crc32(&[kind, data]).to_be_bytes());
}

/// The zlib stream of the scanlines of an RGB image (filter 0), in stored blocks.
fn zlib_scanlines(w: usize, h: usize, rgb: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(h * (w * 3 + 1));
    for row in rgb.chunks_exact(w * 3) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65535).collect();
    for (i, b) in blocks.iter().enumerate() {
        z.push((i + 1 == blocks.len()) as u8);
        let n = b.len() as u16;
        z.extend_from_slice(&n.to_le_bytes());
        z.extend_from_slice(&(!n).to_le_bytes());
        z.extend_from_slice(b);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    z
}

fn check_image(w: u32, h: u32, rgb: &[u8]) -> Result<()> {
    if w == 0 || h == 0 || w > 1 << 15 || h > 1 << 15 || rgb.len() != w as usize * h as usize * 3 {
        return Err(Error::shape(format!(
            "image {w} x {h} with {} bytes: need 1..=32768 per side and 3 bytes a pixel",
            rgb.len()
        )));
    }
    Ok(())
}

fn header(out: &mut Vec<u8>, w: u32, h: u32) {
    out.extend_from_slice(b"\x89PNG\r\n\x1a\n");
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB, no interlace
    chunk(out, b"IHDR", &ihdr);
}

/// A PNG file of a `w × h` RGB image.
///
/// ```
/// use ringkernel_wavesim::image::{decode_png, encode_png};
/// let rgb = vec![7u8; 5 * 3 * 3];
/// let png = encode_png(5, 3, &rgb)?;
/// assert_eq!(decode_png(&png)?, (5, 3, rgb));
/// # Ok::<(), ringkernel_core::Error>(())
/// ```
///
/// Errors: [`Error::ShapeMismatch`] when `rgb` is not `w·h·3` bytes or a side is 0 or
/// over 32768.
pub fn encode_png(w: u32, h: u32, rgb: &[u8]) -> Result<Vec<u8>> {
    check_image(w, h, rgb)?;
    let mut out = Vec::new();
    header(&mut out, w, h);
    chunk(
        &mut out,
        b"IDAT",
        &zlib_scanlines(w as usize, h as usize, rgb),
    );
    chunk(&mut out, b"IEND", &[]);
    Ok(out)
}

/// An animated PNG (APNG) of `frames` (each a `w × h` RGB image) shown `delay_ms` apart,
/// looping forever; viewers without APNG support show the first frame.
///
/// Errors: [`Error::ShapeMismatch`] for no frames or a frame of the wrong size.
pub fn encode_apng(w: u32, h: u32, frames: &[Vec<u8>], delay_ms: u16) -> Result<Vec<u8>> {
    if frames.is_empty() {
        return Err(Error::shape("an animation needs at least one frame"));
    }
    for f in frames {
        check_image(w, h, f)?;
    }
    let mut out = Vec::new();
    header(&mut out, w, h);
    let mut actl = (frames.len() as u32).to_be_bytes().to_vec();
    actl.extend_from_slice(&0u32.to_be_bytes());
    chunk(&mut out, b"acTL", &actl);
    let mut seq = 0u32;
    for (i, f) in frames.iter().enumerate() {
        let mut fctl = Vec::with_capacity(26);
        fctl.extend_from_slice(&seq.to_be_bytes());
        seq += 1;
        fctl.extend_from_slice(&w.to_be_bytes());
        fctl.extend_from_slice(&h.to_be_bytes());
        fctl.extend_from_slice(&[0; 8]); // x, y offsets
        fctl.extend_from_slice(&delay_ms.to_be_bytes());
        fctl.extend_from_slice(&1000u16.to_be_bytes());
        fctl.extend_from_slice(&[0, 0]); // dispose none, blend source
        chunk(&mut out, b"fcTL", &fctl);
        let z = zlib_scanlines(w as usize, h as usize, f);
        if i == 0 {
            chunk(&mut out, b"IDAT", &z);
        } else {
            let mut d = seq.to_be_bytes().to_vec();
            seq += 1;
            d.extend_from_slice(&z);
            chunk(&mut out, b"fdAT", &d);
        }
    }
    chunk(&mut out, b"IEND", &[]);
    Ok(out)
}

/// Reads a PNG written by [`encode_png`] (or the first frame of an [`encode_apng`]
/// file): `(width, height, rgb)`. Checks the signature, every chunk's CRC and the zlib
/// checksum.
///
/// Errors: [`Error::InvalidArgument`] for anything else (other
/// colour types, compressed blocks, a damaged file).
pub fn decode_png(bytes: &[u8]) -> Result<(u32, u32, Vec<u8>)> {
    let bad = |why: &str| Error::invalid(format!("not a PNG this module wrote: {why}"));
    if bytes.len() < 8 || &bytes[..8] != b"\x89PNG\r\n\x1a\n" {
        return Err(bad("signature"));
    }
    let mut at = 8;
    let (mut w, mut h) = (0u32, 0u32);
    let mut z = Vec::new();
    loop {
        let len = bytes
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().unwrap_or([0; 4])) as usize)
            .ok_or_else(|| bad("truncated"))?;
        let kind = bytes.get(at + 4..at + 8).ok_or_else(|| bad("truncated"))?;
        let data = bytes
            .get(at + 8..at + 8 + len)
            .ok_or_else(|| bad("truncated"))?;
        let crc = bytes
            .get(at + 8 + len..at + 12 + len)
            .ok_or_else(|| bad("truncated"))?;
        if crc32(&[kind, data]).to_be_bytes() != crc {
            return Err(bad("chunk CRC"));
        }
        match kind {
            b"IHDR" => {
                if len != 13 || data[8..] != [8, 2, 0, 0, 0] {
                    return Err(bad("not 8-bit RGB"));
                }
                w = u32::from_be_bytes(data[0..4].try_into().unwrap_or([0; 4]));
                h = u32::from_be_bytes(data[4..8].try_into().unwrap_or([0; 4]));
            }
            b"IDAT" => z.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        at += 12 + len;
    }
    if z.len() < 6 || z[0] != 0x78 {
        return Err(bad("zlib header"));
    }
    let mut raw = Vec::new();
    let mut p = 2;
    loop {
        let last = *z.get(p).ok_or_else(|| bad("deflate"))?;
        if last & 0b110 != 0 {
            return Err(bad("compressed deflate block"));
        }
        let n = z.get(p + 1..p + 3).ok_or_else(|| bad("deflate"))?;
        let n = u16::from_le_bytes([n[0], n[1]]) as usize;
        raw.extend_from_slice(z.get(p + 5..p + 5 + n).ok_or_else(|| bad("deflate"))?);
        p += 5 + n;
        if last & 1 == 1 {
            break;
        }
    }
    let sum = z.get(p..p + 4).ok_or_else(|| bad("adler32"))?;
    if adler32(&raw).to_be_bytes() != sum {
        return Err(bad("adler32"));
    }
    let row = w as usize * 3 + 1;
    if raw.len() != row * h as usize {
        return Err(bad("image size"));
    }
    let mut rgb = Vec::with_capacity(w as usize * h as usize * 3);
    for r in raw.chunks_exact(row) {
        if r[0] != 0 {
            return Err(bad("filtered scanline"));
        }
        rgb.extend_from_slice(&r[1..]);
    }
    Ok((w, h, rgb))
}

/// How many frames an APNG file says it has (its `acTL` chunk), `None` for a still PNG
/// or anything unreadable.
pub fn apng_frame_count(bytes: &[u8]) -> Option<u32> {
    let mut at = 8;
    while at + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().ok()?) as usize;
        if &bytes[at + 4..at + 8] == b"acTL" {
            return Some(u32::from_be_bytes(
                bytes.get(at + 8..at + 12)?.try_into().ok()?,
            ));
        }
        at += 12 + len;
    }
    None
}
