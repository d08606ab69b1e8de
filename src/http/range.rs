//! TEMPORARY stub; replaced by the full RFC 9110 module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}
impl ByteRange {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }
    pub fn last(&self) -> u64 {
        self.end - 1
    }
}
#[derive(Debug, Clone, Default)]
pub struct RangePolicy {
    pub max_parts: usize,
    pub part_overhead: u64,
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeDecision {
    Full,
    Partial(Vec<ByteRange>),
    Unsatisfiable,
}
pub fn evaluate(header: Option<&[u8]>, size: u64, _policy: &RangePolicy) -> RangeDecision {
    let Some(h) = header.and_then(|h| std::str::from_utf8(h).ok()) else {
        return RangeDecision::Full;
    };
    let Some(spec) = h.strip_prefix("bytes=") else {
        return RangeDecision::Full;
    };
    let Some((a, b)) = spec.split_once('-') else {
        return RangeDecision::Full;
    };
    let (Ok(a), Ok(b)) = (
        a.parse::<u64>(),
        if b.is_empty() {
            Ok(u64::MAX)
        } else {
            b.parse::<u64>()
        },
    ) else {
        return RangeDecision::Full;
    };
    if a >= size {
        return RangeDecision::Unsatisfiable;
    }
    RangeDecision::Partial(vec![ByteRange {
        start: a,
        end: b.saturating_add(1).min(size),
    }])
}
