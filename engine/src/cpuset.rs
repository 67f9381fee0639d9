//! A fixed-size bit set of CPU ids with the kernel's list syntax (`0-3,8,10-11`).
//!
//! Fixed size so that it is `Copy` and set operations never allocate: a placement decision does
//! many unions and differences and must stay in the microsecond range. The set is generic over
//! its number of 64-bit words: [`CpuSet`] has [`MAX_IDS`] bits, a node set
//! ([`NodeSet`](crate::NodeSet)) fewer, so that a grant's node sets do not carry 1,024 bits
//! each (the agent's memory per container).

use std::fmt;
use std::str::FromStr;

/// Largest id + 1 that a set can hold. 1024 covers every Kunpeng and x86 server in use today;
/// a sysfs id at or above it is reported as an error, never truncated.
pub const MAX_IDS: usize = 1024;
const WORDS: usize = MAX_IDS / 64;

/// A set of ids below `64 * W`.
#[derive(Clone, Copy, Eq)]
pub struct IdSet<const W: usize> {
    bits: [u64; W],
}

/// A set of CPU ids below [`MAX_IDS`].
pub type CpuSet = IdSet<WORDS>;

impl<const W: usize> Default for IdSet<W> {
    fn default() -> Self {
        IdSet::new()
    }
}

/// Word by word, without a branch: inlined as a few vector instructions where the derived
/// comparison calls `memcmp` (a call per compare, and the refresh of shared cpusets compares
/// one per container).
impl<const W: usize> PartialEq for IdSet<W> {
    #[inline]
    fn eq(&self, other: &IdSet<W>) -> bool {
        let diff = self
            .bits
            .iter()
            .zip(&other.bits)
            .fold(0u64, |acc, (a, b)| acc | (a ^ b));
        diff == 0
    }
}

/// As derived (the words in order), next to the hand-written equality it must agree with.
impl<const W: usize> std::hash::Hash for IdSet<W> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bits.hash(state);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("invalid cpu list {input:?}: {what}")]
    Invalid { input: String, what: &'static str },
    #[error("invalid cpu list {input:?}: id {id} is not below the supported maximum {max}")]
    TooLarge {
        input: String,
        id: usize,
        max: usize,
    },
}

impl<const W: usize> IdSet<W> {
    /// Largest id + 1 the set can hold.
    pub const MAX: usize = 64 * W;

    pub const fn new() -> Self {
        IdSet { bits: [0; W] }
    }

    /// Inserts `id`. Returns false (and leaves the set unchanged) when `id >= Self::MAX`.
    pub fn insert(&mut self, id: usize) -> bool {
        if id >= Self::MAX {
            return false;
        }
        self.bits[id / 64] |= 1u64 << (id % 64);
        true
    }

    pub fn remove(&mut self, id: usize) {
        if id < Self::MAX {
            self.bits[id / 64] &= !(1u64 << (id % 64));
        }
    }

    pub fn contains(&self, id: usize) -> bool {
        id < Self::MAX && self.bits[id / 64] & (1u64 << (id % 64)) != 0
    }

    pub fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|w| *w == 0)
    }

    /// The id of a one-member set; `None` for an empty set or one of several members. Cheaper
    /// than [`IdSet::len`] (a population count of every word) where sets are mostly single.
    pub fn single(&self) -> Option<usize> {
        let mut found = None;
        for (wi, &w) in self.bits.iter().enumerate() {
            if w == 0 {
                continue;
            }
            if found.is_some() || w & (w - 1) != 0 {
                return None;
            }
            found = Some(wi * 64 + w.trailing_zeros() as usize);
        }
        found
    }

    /// The set whose every word is `op` of the two sets' words.
    #[inline]
    fn word_by_word(&self, other: &Self, op: impl Fn(u64, u64) -> u64) -> Self {
        let mut out = *self;
        for (o, b) in out.bits.iter_mut().zip(other.bits.iter()) {
            *o = op(*o, *b);
        }
        out
    }

    pub fn union(&self, other: &Self) -> Self {
        self.word_by_word(other, |a, b| a | b)
    }

    pub fn intersection(&self, other: &Self) -> Self {
        self.word_by_word(other, |a, b| a & b)
    }

    pub fn difference(&self, other: &Self) -> Self {
        self.word_by_word(other, |a, b| a & !b)
    }

    /// The CPUs in exactly one of the two sets.
    pub fn symmetric_difference(&self, other: &Self) -> Self {
        self.word_by_word(other, |a, b| a ^ b)
    }

    pub fn is_subset(&self, other: &Self) -> bool {
        self.bits
            .iter()
            .zip(other.bits.iter())
            .all(|(a, b)| a & !b == 0)
    }

    pub fn intersects(&self, other: &Self) -> bool {
        self.bits
            .iter()
            .zip(other.bits.iter())
            .any(|(a, b)| a & b != 0)
    }

    /// Ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.bits.iter().enumerate().flat_map(|(wi, &w)| {
            let mut word = w;
            std::iter::from_fn(move || {
                if word == 0 {
                    return None;
                }
                let tz = word.trailing_zeros() as usize;
                word &= word - 1;
                Some(wi * 64 + tz)
            })
        })
    }

    pub fn first(&self) -> Option<usize> {
        self.iter().next()
    }

    /// Parses the kernel list syntax. Whitespace around the list (a trailing newline from sysfs)
    /// is ignored; the empty string is the empty set.
    pub fn parse(input: &str) -> Result<Self, ParseError> {
        let s = input.trim();
        let mut set = Self::new();
        if s.is_empty() {
            return Ok(set);
        }
        let invalid = |what| ParseError::Invalid {
            input: input.to_string(),
            what,
        };
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(invalid("empty element"));
            }
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (
                    a.trim()
                        .parse::<usize>()
                        .map_err(|_| invalid("not a number"))?,
                    b.trim()
                        .parse::<usize>()
                        .map_err(|_| invalid("not a number"))?,
                ),
                None => {
                    let v = part.parse::<usize>().map_err(|_| invalid("not a number"))?;
                    (v, v)
                }
            };
            if lo > hi {
                return Err(invalid("range end before its start"));
            }
            if hi >= Self::MAX {
                return Err(ParseError::TooLarge {
                    input: input.to_string(),
                    id: hi,
                    max: Self::MAX,
                });
            }
            for id in lo..=hi {
                set.insert(id);
            }
        }
        Ok(set)
    }

    /// Parses the kernel's hexadecimal mask syntax (`cpumap`: `00000000,0000ffff`).
    pub fn parse_mask(input: &str) -> Result<Self, ParseError> {
        let s: String = input.trim().chars().filter(|c| *c != ',').collect();
        let mut set = Self::new();
        for (pos, ch) in s.chars().rev().enumerate() {
            let nib = ch.to_digit(16).ok_or_else(|| ParseError::Invalid {
                input: input.to_string(),
                what: "not a hexadecimal mask",
            })?;
            for bit in 0..4 {
                if nib & (1 << bit) != 0 {
                    let id = pos * 4 + bit;
                    if !set.insert(id) {
                        return Err(ParseError::TooLarge {
                            input: input.to_string(),
                            id,
                            max: Self::MAX,
                        });
                    }
                }
            }
        }
        Ok(set)
    }

    pub fn from_ids<I: IntoIterator<Item = usize>>(ids: I) -> Self {
        let mut s = Self::new();
        for id in ids {
            s.insert(id);
        }
        s
    }
}

impl<const W: usize> FromStr for IdSet<W> {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IdSet::parse(s)
    }
}

impl<const W: usize> fmt::Display for IdSet<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.iter().peekable();
        while let Some(lo) = it.next() {
            let mut hi = lo;
            while it.peek() == Some(&(hi + 1)) {
                hi += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

/// `CpuSet(0-3)`: [`NodeSet`](crate::NodeSet) has its own.
impl<const W: usize> fmt::Debug for IdSet<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl<const W: usize> serde::Serialize for IdSet<W> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de, const W: usize> serde::Deserialize<'de> for IdSet<W> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        IdSet::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_format_round_trip() {
        for s in ["", "0", "0-3", "0-23,48-71", "1,3,5", "0-1,3-4,1023"] {
            assert_eq!(CpuSet::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(CpuSet::parse(" 0-2 ,4\n").unwrap().to_string(), "0-2,4");
        assert_eq!(CpuSet::parse("0,1,2,3").unwrap().to_string(), "0-3");
    }

    #[test]
    fn parse_rejects_bad_input() {
        for s in ["a", "1-", "3-1", "1,,2", "-1", "1024", "0-5000"] {
            assert!(CpuSet::parse(s).is_err(), "{s} should be rejected");
        }
    }

    #[test]
    fn mask_parsing() {
        assert_eq!(
            CpuSet::parse_mask("00000000,0000ff0f").unwrap().to_string(),
            "0-3,8-15"
        );
        assert_eq!(CpuSet::parse_mask("1,00000000").unwrap().to_string(), "32");
        assert!(CpuSet::parse_mask("xyz").is_err());
    }

    #[test]
    fn set_operations() {
        let a = CpuSet::parse("0-7").unwrap();
        let b = CpuSet::parse("4-11").unwrap();
        assert_eq!(a.union(&b).to_string(), "0-11");
        assert_eq!(a.intersection(&b).to_string(), "4-7");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert!(CpuSet::parse("1-2").unwrap().is_subset(&a));
        assert!(!b.is_subset(&a));
        assert_eq!(a.len(), 8);
        assert_eq!(b.first(), Some(4));
    }

    #[test]
    fn single_is_the_one_member_of_a_one_member_set() {
        for (s, want) in [
            ("", None),
            ("0", Some(0)),
            ("63", Some(63)),
            ("64", Some(64)),
            ("1023", Some(1023)),
            ("0-1", None),
            ("3,70", None),
            ("70,1023", None),
        ] {
            assert_eq!(CpuSet::parse(s).unwrap().single(), want, "{s}");
        }
    }
}
