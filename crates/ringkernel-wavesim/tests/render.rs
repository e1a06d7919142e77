//! Pictures: the colour map, PNG / APNG files, and the headless run.

use ringkernel_wavesim::image::{
    apng_frame_count, decode_png, encode_apng, encode_png, render_rgb, BACKGROUND, NEGATIVE,
    POSITIVE, REFLECTOR,
};
use ringkernel_wavesim::scene::{demo_scene, run_headless};
use ringkernel_wavesim::{WaveGrid2D, WaveParams};

#[test]
fn png_round_trip_of_awkward_sizes() {
    for (w, h) in [(1u32, 1u32), (7, 3), (300, 251)] {
        // Large enough for several stored deflate blocks at 300 x 251.
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 31 % 251) as u8).collect();
        let png = encode_png(w, h, &rgb).unwrap();
        assert_eq!(decode_png(&png).unwrap(), (w, h, rgb.clone()));
        let mut broken = png.clone();
        let mid = broken.len() / 2;
        broken[mid] ^= 0x40;
        assert!(
            decode_png(&broken).is_err(),
            "a damaged file must not decode"
        );
    }
    assert!(encode_png(2, 2, &[0; 11]).is_err());
    assert!(encode_png(0, 2, &[]).is_err());
    let frames = vec![
        vec![1u8; 4 * 5 * 3],
        vec![2u8; 4 * 5 * 3],
        vec![3u8; 4 * 5 * 3],
    ];
    let apng = encode_apng(4, 5, &frames, 50).unwrap();
    assert_eq!(apng_frame_count(&apng), Some(3));
    assert_eq!(decode_png(&apng).unwrap().2, frames[0]);
    assert!(encode_apng(4, 5, &[], 50).is_err());
    assert!(encode_apng(4, 5, &[vec![0u8; 3]], 50).is_err());
}

#[test]
fn colours_follow_the_field() {
    let mut g = WaveGrid2D::new(5, 1, WaveParams::default()).unwrap();
    g.set_field(&[1.0, -1.0, 0.0, 0.25, 0.0]).unwrap();
    g.set_reflector(4, 0).unwrap();
    let rgb = render_rgb(&g, 0.5);
    let px = |i: usize| [rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2]];
    assert_eq!(px(0), POSITIVE);
    assert_eq!(px(1), NEGATIVE);
    assert_eq!(px(2), BACKGROUND);
    assert_eq!(px(4), REFLECTOR);
    let half = px(3);
    for c in 0..3 {
        let (lo, hi) = (
            BACKGROUND[c].min(POSITIVE[c]),
            BACKGROUND[c].max(POSITIVE[c]),
        );
        assert!(half[c] > lo && half[c] < hi, "{half:?}");
    }
}

#[test]
fn headless_frames_show_the_wave_spreading() {
    let dir = std::env::temp_dir().join(format!("rk-wavesim-render-{}", std::process::id()));
    let mut g = demo_scene(128).unwrap();
    let r = run_headless(&mut g, 160, 4, &dir).unwrap();
    assert_eq!(r.frames.len(), 4);
    let lit = |path: &std::path::Path| {
        let (w, h, rgb) = decode_png(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!((w, h), (128, 128));
        // Pixels off the background, the walls and the border tint, within 40 cells of
        // the source (48, 64).
        (0..128usize * 128)
            .filter(|&k| {
                let (x, y) = ((k % 128) as i64, (k / 128) as i64);
                let p = &rgb[3 * k..3 * k + 3];
                (x - 48).pow(2) + (y - 64).pow(2) < 1600 && p != BACKGROUND && p != REFLECTOR
            })
            .count()
    };
    let first = lit(&r.frames[0]);
    let last = lit(&r.frames[3]);
    assert!(first > 20, "the source is visible early ({first} pixels)");
    assert!(
        last > 4 * first,
        "the wave spreads: {first} then {last} pixels"
    );
    let anim = std::fs::read(&r.animation).unwrap();
    assert_eq!(apng_frame_count(&anim), Some(4));
    std::fs::remove_dir_all(&dir).ok();
    assert!(run_headless(&mut g, 3, 5, &dir).is_err());
    assert!(demo_scene(16).is_err());
}
