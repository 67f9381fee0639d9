//! The `numaplacement` encoding of which container sits on which NUMA node, as the
//! scheduler-plugins NodeResourceTopologyMatch plugin decodes it for its NUMA-aware preemption
//! (`preemptionMode: Enabled`; the Go module `github.com/k8stopologyawareschedwg/numaplacement`,
//! format `npv0` version `v001`, vector encoding `leb89`). Written from its description, not
//! from its code:
//!
//! - every container is named by the xxhash64 (seed 0) of `namespace \0 pod \0 container`;
//!   both sides sort the hashes of the same container set, so a container is its offset in
//!   that sorted list;
//! - the object's attribute [`METADATA_ATTRIBUTE`] says
//!   `npv0v001::ve=leb89::cc=<containers>::nn=<NUMA nodes>::bn=<busiest node>`;
//! - each zone but the busiest one (the node with the most containers, the lowest id on a tie)
//!   that holds containers carries [`VECTOR_ATTRIBUTE`]: its containers' offsets, ascending,
//!   the first as is and each next one as the difference from the one before, each number in
//!   LEB89 (below). A container in no vector is on the busiest node.
//!
//! LEB89 writes a number with 89 printable ASCII characters that JSON carries unescaped
//! (`!` to `~` but `"`, `&`, `<`, `>` and `\`): the first 64 of them end a number (its last
//! digit, base 64), the other 25 are the digits before it (base 25); a number below 64 is one
//! character, larger ones subtract 64 first.
//!
//! The format names one node per container: it has no "several" and no "unknown"
//! (see [`super::nrt`] for what the agent does with such containers).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use twox_hash::XxHash64;

/// The object's attribute: container count and decoding parameters.
pub const METADATA_ATTRIBUTE: &str = "topology.node.k8s.io/numaplacement-metadata";
/// The zone's attribute: the offsets of the containers on that NUMA node.
pub const VECTOR_ATTRIBUTE: &str = "topology.node.k8s.io/numaplacement-vector";
/// Format prefix and version of the metadata.
const PREFIX_VERSION: &str = "npv0v001";
const SEPARATOR: &str = "::";
/// The one vector encoding the decoder accepts.
pub const VECTOR_ENCODING: &str = "leb89";

/// Characters ending a LEB89 number (its last, base-64 digit).
const TERMINALS: u64 = 64;
/// Characters before the last one (base-25 digits).
const CONTINUATIONS: u64 = 25;

/// The name of a container in the encoding.
pub fn container_hash(namespace: &str, pod: &str, container: &str) -> u64 {
    let mut bytes = Vec::with_capacity(namespace.len() + pod.len() + container.len() + 2);
    for (i, part) in [namespace, pod, container].into_iter().enumerate() {
        if i > 0 {
            bytes.push(0);
        }
        bytes.extend_from_slice(part.as_bytes());
    }
    XxHash64::oneshot(0, &bytes)
}

/// The LEB89 alphabet: `!`..=`~` without the five characters JSON encoders escape.
fn alphabet() -> impl Iterator<Item = u8> {
    (0x21u8..=0x7e).filter(|b| !matches!(b, b'"' | b'&' | b'<' | b'>' | b'\\'))
}

/// The character of digit `i` (0..89).
fn symbol(i: u64) -> char {
    alphabet()
        .nth(usize::try_from(i).unwrap_or(usize::MAX))
        .map_or('!', char::from)
}

/// Appends `v` in LEB89.
pub fn leb89(out: &mut String, v: u64) {
    if v < TERMINALS {
        out.push(symbol(v));
        return;
    }
    let rest = v - TERMINALS;
    let last = rest % TERMINALS;
    let mut high = rest / TERMINALS;
    let mut digits = Vec::with_capacity(4);
    loop {
        digits.push(high % CONTINUATIONS);
        high /= CONTINUATIONS;
        if high == 0 {
            break;
        }
    }
    for d in digits.iter().rev() {
        out.push(symbol(TERMINALS + d));
    }
    out.push(symbol(last));
}

/// Ascending offsets as a vector: the first as is, then the differences, in LEB89.
pub fn vector(ascending: &[u64]) -> String {
    let mut out = String::with_capacity(ascending.len() + ascending.len() / 8);
    let mut previous = None;
    for &o in ascending {
        leb89(&mut out, previous.map_or(o, |p: u64| o.saturating_sub(p)));
        previous = Some(o);
    }
    out
}

/// What the agent publishes: the metadata and one vector per NUMA node (the busiest one and
/// the empty ones have none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    pub containers: usize,
    pub numa_nodes: u32,
    pub busiest: u32,
    pub vectors: BTreeMap<u32, String>,
}

impl Payload {
    /// The value of [`METADATA_ATTRIBUTE`].
    pub fn metadata(&self) -> String {
        let mut s = String::with_capacity(48);
        let _ = write!(
            s,
            "{PREFIX_VERSION}{SEPARATOR}ve={VECTOR_ENCODING}{SEPARATOR}cc={}{SEPARATOR}nn={}{SEPARATOR}bn={}",
            self.containers, self.numa_nodes, self.busiest
        );
        s
    }
}

/// Why a set of placements cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("no NUMA node to place containers on")]
    NoNumaNodes,
    #[error("NUMA node {node} is beyond the {nodes} nodes encoded")]
    NodeOutOfRange { node: u32, nodes: u32 },
}

/// Encodes containers (by [`container_hash`]) on NUMA nodes `0..numa_nodes`; a container given
/// twice keeps its last node.
pub fn encode(
    numa_nodes: u32,
    placed: impl IntoIterator<Item = (u64, u32)>,
) -> Result<Payload, EncodeError> {
    if numa_nodes == 0 {
        return Err(EncodeError::NoNumaNodes);
    }
    let mut by_hash = BTreeMap::new();
    for (hash, node) in placed {
        if node >= numa_nodes {
            return Err(EncodeError::NodeOutOfRange {
                node,
                nodes: numa_nodes,
            });
        }
        by_hash.insert(hash, node);
    }
    // BTreeMap: the hashes ascending, so each offset is its position.
    let mut per_node: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (offset, node) in by_hash.values().enumerate() {
        let offset = u64::try_from(offset).unwrap_or(u64::MAX);
        per_node.entry(*node).or_default().push(offset);
    }
    // The most containers; on a tie the lowest node (ascending iteration, strictly more wins).
    let mut busiest = (0u32, 0usize);
    for (node, offsets) in &per_node {
        if offsets.len() > busiest.1 {
            busiest = (*node, offsets.len());
        }
    }
    let vectors = per_node
        .iter()
        .filter(|(node, _)| **node != busiest.0)
        .map(|(node, offsets)| (*node, vector(offsets)))
        .collect();
    Ok(Payload {
        containers: by_hash.len(),
        numa_nodes,
        busiest: busiest.0,
        vectors,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A LEB89 decoder and a payload decoder, written here from the format's description, to
    /// check what the agent publishes reads back.
    pub(crate) fn decode_leb89(s: &str) -> Option<Vec<u64>> {
        let index = |c: u8| alphabet().position(|a| a == c).map(|i| i as u64);
        let mut out = Vec::new();
        let (mut high, mut digits) = (0u64, 0usize);
        for c in s.bytes() {
            let i = index(c)?;
            if i < TERMINALS {
                out.push(if digits == 0 {
                    i
                } else {
                    TERMINALS + high * TERMINALS + i
                });
                (high, digits) = (0, 0);
            } else {
                high = high * CONTINUATIONS + (i - TERMINALS);
                digits += 1;
            }
        }
        (digits == 0).then_some(out)
    }

    pub(crate) fn decode_vector(s: &str) -> Option<Vec<u64>> {
        let mut total = 0;
        let mut out = Vec::new();
        for (i, v) in decode_leb89(s)?.into_iter().enumerate() {
            total = if i == 0 { v } else { total + v };
            out.push(total);
        }
        Some(out)
    }

    /// The metadata's `(cc, nn, bn)`, refusing any other prefix, version or encoding.
    pub(crate) fn decode_metadata(s: &str) -> Option<(usize, u32, u32)> {
        let rest = s.strip_prefix("npv0v001::")?;
        let (mut cc, mut nn, mut bn, mut ve) = (None, None, None, None);
        for pair in rest.split("::") {
            let (k, v) = pair.split_once('=')?;
            match k {
                "ve" => ve = Some(v.to_string()),
                "cc" => cc = v.parse().ok(),
                "nn" => nn = v.parse().ok(),
                "bn" => bn = v.parse().ok(),
                _ => return None,
            }
        }
        (ve.as_deref() == Some("leb89")).then_some(())?;
        Some((cc?, nn?, bn?))
    }

    /// Each container's node from a payload and the container set (as the scheduler does).
    pub(crate) fn decode(
        metadata: &str,
        vectors: &BTreeMap<u32, String>,
        containers: &[(&str, &str, &str)],
    ) -> Option<BTreeMap<(String, String, String), u32>> {
        let (cc, nn, bn) = decode_metadata(metadata)?;
        let mut hashes: Vec<u64> = containers
            .iter()
            .map(|(ns, p, c)| container_hash(ns, p, c))
            .collect();
        hashes.sort_unstable();
        hashes.dedup();
        if hashes.len() != cc || bn >= nn || vectors.contains_key(&bn) {
            return None;
        }
        let mut node_of: BTreeMap<u64, u32> = BTreeMap::new();
        for (node, v) in vectors {
            if *node >= nn {
                return None;
            }
            for off in decode_vector(v)? {
                let h = *hashes.get(usize::try_from(off).ok()?)?;
                if node_of.insert(h, *node).is_some() {
                    return None;
                }
            }
        }
        Some(
            containers
                .iter()
                .map(|(ns, p, c)| {
                    let h = container_hash(ns, p, c);
                    let node = node_of.get(&h).copied().unwrap_or(bn);
                    ((ns.to_string(), p.to_string(), c.to_string()), node)
                })
                .collect(),
        )
    }

    /// The module's hash vectors (`TestContainerIDHash`): the empty identity and ns/pod/cnt.
    #[test]
    fn container_hashes_match_the_reference() {
        assert_eq!(container_hash("", "", ""), 11_145_182_160_106_660_097);
        assert_eq!(
            container_hash("ns", "pod", "cnt"),
            9_468_815_510_407_277_218
        );
    }

    /// The alphabet's split (`TestLeb89TerminalContinuationSplit`), its size and lengths at
    /// the boundaries (`TestLeb89ValueRangeBoundaries`).
    #[test]
    fn leb89_alphabet_and_lengths() {
        let a: Vec<u8> = alphabet().collect();
        assert_eq!(a.len(), 89);
        assert!(a[..64].iter().all(|c| (b'!'..=b'e').contains(c)));
        assert!(a[64..].iter().all(|c| (b'f'..=b'~').contains(c)));
        let len = |v| {
            let mut s = String::new();
            leb89(&mut s, v);
            s.len()
        };
        for (v, n) in [
            (0, 1),
            (63, 1),
            (64, 2),
            (1663, 2),
            (1664, 3),
            (40063, 3),
            (40064, 4),
            (1_000_063, 4),
        ] {
            assert_eq!(len(v), n, "{v}");
        }
        for v in 0..50_000u64 {
            let mut s = String::new();
            leb89(&mut s, v);
            assert_eq!(decode_leb89(&s), Some(vec![v]), "{v}");
        }
    }

    /// The module's vector examples (`TestEncodeDecodePerNUMAVector`,
    /// `TestDecodePerNUMAVectorKnownStrings`), byte for byte.
    #[test]
    fn vectors_match_the_reference_strings() {
        let cases: [(&[u64], &str); 5] = [
            (&[1, 3, 7, 42], "#$'H"),
            (&[0, 4, 8, 10], "!''$"),
            (&[100, 108, 116], "fI++"),
            (&[2000, 2008], "gk3+"),
            (&[], ""),
        ];
        for (offsets, want) in cases {
            assert_eq!(vector(offsets), want, "{offsets:?}");
            assert_eq!(decode_vector(want).as_deref(), Some(offsets));
        }
        let dense: Vec<u64> = (0..1024).collect();
        assert_eq!(decode_vector(&vector(&dense)), Some(dense));
    }

    /// The module's metadata examples (`TestPackMetadata`), byte for byte.
    #[test]
    fn metadata_matches_the_reference_strings() {
        let p = |containers, numa_nodes, busiest| Payload {
            containers,
            numa_nodes,
            busiest,
            vectors: BTreeMap::new(),
        };
        assert_eq!(
            p(0, 0, 0).metadata(),
            "npv0v001::ve=leb89::cc=0::nn=0::bn=0"
        );
        assert_eq!(
            p(4, 2, 1).metadata(),
            "npv0v001::ve=leb89::cc=4::nn=2::bn=1"
        );
    }

    /// The module's encoder examples (`TestEncoderResult`): container sets, their payloads.
    #[test]
    fn payloads_match_the_reference_examples() {
        let h = |ns, pod| container_hash(ns, pod, "cnt1");
        let v = |pairs: &[(u32, &str)]| -> BTreeMap<u32, String> {
            pairs.iter().map(|(n, s)| (*n, s.to_string())).collect()
        };
        // (NUMA nodes, placements, then the payload's cc, bn and vectors)
        type Case = (u32, Vec<(u64, u32)>, usize, u32, BTreeMap<u32, String>);
        let cases: [Case; 8] = [
            (2, vec![], 0, 0, v(&[])),
            (
                1,
                vec![
                    (h("ns1", "pod1"), 0),
                    (h("ns1", "pod2"), 0),
                    (h("ns1", "pod3"), 0),
                ],
                3,
                0,
                v(&[]),
            ),
            (
                2,
                vec![
                    (h("ns1", "pod1"), 0),
                    (h("ns1", "pod2"), 0),
                    (h("ns1", "pod3"), 0),
                ],
                3,
                0,
                v(&[]),
            ),
            (
                2,
                vec![
                    (h("ns1", "pod1"), 0),
                    (h("ns1", "pod2"), 0),
                    (h("ns1", "pod2"), 0),
                ],
                2,
                0,
                v(&[]),
            ),
            (
                2,
                vec![
                    (h("ns1", "pod1"), 0),
                    (h("ns1", "pod2"), 0),
                    (h("ns1", "pod3"), 0),
                    (h("ns2", "pod1"), 1),
                ],
                4,
                0,
                v(&[(1, "#")]),
            ),
            (
                2,
                vec![
                    (h("ns1", "pod1"), 0),
                    (h("ns1", "pod2"), 0),
                    (h("ns2", "pod1"), 1),
                    (h("ns2", "pod2"), 1),
                ],
                4,
                0,
                v(&[(1, "!%")]),
            ),
            (
                2,
                vec![
                    (h("ns1", "pod1"), 0),
                    (h("ns2", "pod1"), 1),
                    (h("ns2", "pod2"), 1),
                    (h("ns2", "pod3"), 1),
                ],
                4,
                1,
                v(&[(0, "$")]),
            ),
            (
                4,
                vec![
                    (h("ns1", "pod1"), 0),
                    (h("ns1", "pod2"), 0),
                    (h("ns1", "pod3"), 0),
                    (h("ns2", "pod4"), 1),
                    (h("ns3", "pod5"), 2),
                ],
                5,
                0,
                v(&[(1, "!"), (2, "'")]),
            ),
        ];
        for (i, (nodes, placed, cc, bn, vectors)) in cases.into_iter().enumerate() {
            let got = encode(nodes, placed).expect("encodable");
            let want = Payload {
                containers: cc,
                numa_nodes: nodes,
                busiest: bn,
                vectors,
            };
            assert_eq!(got, want, "case {i}");
        }
    }

    #[test]
    fn refuses_what_the_format_cannot_say() {
        assert_eq!(encode(0, []), Err(EncodeError::NoNumaNodes));
        assert_eq!(
            encode(4, [(1, 15)]),
            Err(EncodeError::NodeOutOfRange { node: 15, nodes: 4 })
        );
    }

    /// Anything encoded reads back: every container on its node.
    #[test]
    fn encoded_placements_decode_back() {
        let names: Vec<(String, String, String)> = (0..300)
            .map(|i| {
                (
                    format!("ns{}", i % 7),
                    format!("pod-{i}"),
                    format!("c{}", i % 3),
                )
            })
            .collect();
        let ids: Vec<(&str, &str, &str)> = names
            .iter()
            .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
            .collect();
        for nodes in [1u32, 2, 4, 8] {
            let node_of = |i: usize| ((i * 7 + i / 5) % nodes as usize) as u32;
            let placed = ids
                .iter()
                .enumerate()
                .map(|(i, (ns, p, c))| (container_hash(ns, p, c), node_of(i)));
            let pl = encode(nodes, placed).expect("encodable");
            let got = decode(&pl.metadata(), &pl.vectors, &ids).expect("decodes");
            for (i, (ns, p, c)) in ids.iter().enumerate() {
                let key = (ns.to_string(), p.to_string(), c.to_string());
                assert_eq!(got.get(&key), Some(&node_of(i)), "{nodes} nodes, {key:?}");
            }
        }
    }
}
