//! Human units for sizes and durations, as operators type and read them.
//!
//! Sizes are parsed by the `bytesize` crate: a number (decimals allowed)
//! and an optional unit, with or without a space. Decimal units are powers
//! of 1000 (`K`, `KB`, `M`, `MB`, `G`, `GB`, `T`, `TB`, …), binary units
//! powers of 1024 (`KiB`, `MiB`, `GiB`, `TiB`, …); a bare number is bytes.
//! So `50G` is 50,000,000,000 bytes and `50GiB` is 53,687,091,200. A size
//! that does not fit in 64 bits is an error, never silently saturated.
//!
//! Durations are parsed by the `humantime` crate (`500ms`, `90s`, `15m`,
//! `1h30m`, `1h 30m`, `2d`); a bare integer is seconds, as the command
//! line accepted before units were general.
//!
//! Printing is the inverse: [`format_size`] gives binary units with one
//! decimal (`46.6 GiB`), [`format_duration`] humantime's form (`1h 30m`).
//! [`format_size_exact`] adds the exact byte count where a rounded figure
//! could mislead (`deltapack config show`).

use std::time::Duration;

/// Parses a size such as `50G`, `50GiB`, `1.5TB`, `64 MiB` or `1000`.
///
/// # Errors
/// A message naming the input when it is not a size or exceeds `u64`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty size (e.g. 64MiB, 50G, 1.5TB, 1000)".into());
    }
    // Exact integers are taken as they are: a float round trip would lose
    // the low bits of large byte counts.
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    let parsed: bytesize::ByteSize = t
        .parse()
        .map_err(|e| format!("invalid size {t:?}: {e} (e.g. 64MiB, 50G, 1.5TB, 1000)"))?;
    let n = parsed.as_u64();
    // bytesize saturates on overflow; a size that large is a typo.
    if n == u64::MAX {
        return Err(format!("size {t:?} does not fit in 64 bits"));
    }
    Ok(n)
}

/// A size in binary units with one decimal (`1.5 KiB`, `64.0 MiB`), or
/// plain bytes below 1 KiB (`1000 B`).
pub fn format_size(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec().to_string()
}

/// [`format_size`] followed by the exact count when they differ:
/// `46.6 GiB (50000000000 bytes)`.
pub fn format_size_exact(n: u64) -> String {
    let human = format_size(n);
    if n < 1024 {
        human
    } else {
        format!("{human} ({n} bytes)")
    }
}

/// Parses a duration such as `500ms`, `90s`, `15m`, `1h30m` or `90`
/// (seconds).
///
/// # Errors
/// A message naming the input when it is not a duration.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("invalid duration {t:?}: {e} (e.g. 500ms, 90s, 15m, 1h30m)"))
}

/// A duration in humantime's form (`1h 30m`, `500ms`, `0s`).
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_named_in_the_docs() {
        assert_eq!(parse_size("50G"), Ok(50_000_000_000));
        assert_eq!(parse_size("50GiB"), Ok(50 << 30));
        assert_eq!(parse_size("1.5TB"), Ok(1_500_000_000_000));
        assert_eq!(parse_size("64 MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_size("99999999999999999999TB").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("abc").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(10), "10 B");
        assert_eq!(
            format_size_exact(50_000_000_000),
            "46.6 GiB (50000000000 bytes)"
        );
    }

    #[test]
    fn durations_named_in_the_docs() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("x").is_err());
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h 30m");
    }

    proptest::proptest! {
        /// Printing a size in binary units and parsing the print gives the
        /// size back within the print's rounding (one decimal of the unit).
        #[test]
        fn printed_sizes_parse_back(n in 0u64..(1u64 << 62)) {
            let printed = format_size(n);
            let back = parse_size(&printed).map_err(proptest::test_runner::TestCaseError::fail)?;
            let unit = 1u64 << (10 * ((63 - n.max(1).leading_zeros()) / 10));
            let tolerance = unit / 20 + 1; // half of 0.1 unit, plus rounding
            proptest::prop_assert!(back.abs_diff(n) <= tolerance, "{n} -> {printed} -> {back}");
        }

        /// Exact integers always parse back exactly.
        #[test]
        fn integers_parse_exactly(n: u64) {
            proptest::prop_assert_eq!(parse_size(&n.to_string()), Ok(n));
        }

        /// Durations print and parse back exactly (humantime prints every
        /// unit down to nanoseconds).
        #[test]
        fn printed_durations_parse_back(secs in 0u64..(100 * 365 * 86_400), nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            proptest::prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }
}
