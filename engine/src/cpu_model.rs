//! Which CPU the machine has: the Arm Main ID Register (`MIDR_EL1`) as sysfs shows it
//! (`devices/system/cpu/cpuN/regs/identification/midr_el1`), else `/proc/cpuinfo`'s
//! `CPU implementer` / `CPU part` lines (Arm) or `vendor_id` / `model name` (x86).
//!
//! Pure: the text comes in through [`FileSource`]s ([`identify`]); parsing never fails the
//! caller. What cannot be read or parsed leaves the model [`CpuModel::unknown`] and comes back
//! as a [`CpuModelProblem`] for the caller to log.
//!
//! The reference builds cluster pools only on CPU part 0xd06 (which it calls Kunpeng 950);
//! [`ClusterAffinityRule::Kunpeng950Only`] is that rule, [`ClusterAffinityRule::Any`] ours.

use crate::source::FileSource;
use std::fmt;

/// HiSilicon's implementer code.
pub const HISILICON: u8 = 0x48;
/// Kunpeng 920's part number (HiSilicon TSV110).
pub const PART_KUNPENG_920: u16 = 0xd01;
/// The part number the reference checks before it builds cluster pools (Kunpeng 950).
pub const PART_KUNPENG_950: u16 = 0xd06;

/// Longest text kept from `/proc/cpuinfo` (it goes into metric labels and the status).
const MAX_TEXT: usize = 64;

/// The fields of `MIDR_EL1`: bits 31:24 implementer, 23:20 variant, 19:16 architecture,
/// 15:4 part number, 3:0 revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Midr {
    pub implementer: u8,
    pub variant: u8,
    pub architecture: u8,
    pub part: u16,
    pub revision: u8,
}

impl Midr {
    /// The fields of a register value (the upper 32 bits are reserved and ignored).
    pub fn from_bits(bits: u64) -> Midr {
        let field = |shift: u32, mask: u64| (bits >> shift) & mask;
        Midr {
            implementer: field(24, 0xff) as u8,
            variant: field(20, 0xf) as u8,
            architecture: field(16, 0xf) as u8,
            part: field(4, 0xfff) as u16,
            revision: field(0, 0xf) as u8,
        }
    }

    /// The register value.
    pub fn bits(&self) -> u32 {
        (u32::from(self.implementer) << 24)
            | (u32::from(self.variant & 0xf) << 20)
            | (u32::from(self.architecture & 0xf) << 16)
            | (u32::from(self.part & 0xfff) << 4)
            | u32::from(self.revision & 0xf)
    }

    /// sysfs's text, `0x00000000481fd010` (the `0x` optional, surrounding blanks ignored).
    pub fn parse(text: &str) -> Option<Midr> {
        let t = text.trim();
        let hex = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X"))?;
        if hex.is_empty() || hex.len() > 16 {
            return None;
        }
        u64::from_str_radix(hex, 16).ok().map(Midr::from_bits)
    }

    /// The CPU this names, when it is one kunpeng-tap knows by name.
    pub fn known(&self) -> Option<KnownCpu> {
        match (self.implementer, self.part) {
            (HISILICON, PART_KUNPENG_920) => Some(KnownCpu::Kunpeng920),
            (HISILICON, PART_KUNPENG_950) => Some(KnownCpu::Kunpeng950),
            _ => None,
        }
    }
}

/// CPUs kunpeng-tap knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KnownCpu {
    /// HiSilicon implementer 0x48, part 0xd01.
    Kunpeng920,
    /// HiSilicon implementer 0x48, part 0xd06: the part the reference builds cluster pools on.
    Kunpeng950,
}

impl KnownCpu {
    pub fn name(self) -> &'static str {
        match self {
            KnownCpu::Kunpeng920 => "HiSilicon Kunpeng 920",
            KnownCpu::Kunpeng950 => "HiSilicon Kunpeng 950",
        }
    }
}

/// The name of an Arm implementer code, for the ones commonly met in servers and VMs.
fn implementer_name(code: u8) -> Option<&'static str> {
    Some(match code {
        0x00 => "software-defined",
        0x41 => "Arm",
        0x43 => "Cavium",
        0x46 => "Fujitsu",
        HISILICON => "HiSilicon",
        0x4e => "NVIDIA",
        0x50 => "Applied Micro",
        0x51 => "Qualcomm",
        0x61 => "Apple",
        0x6d => "Microsoft",
        0xc0 => "Ampere",
        _ => return None,
    })
}

/// Where the model was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuModelSource {
    /// `devices/system/cpu/cpuN/regs/identification/midr_el1` under the sysfs root.
    SysfsMidr,
    /// `cpuinfo` under the proc root.
    ProcCpuinfo,
    /// Nowhere: neither told anything usable.
    #[default]
    None,
}

impl CpuModelSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuModelSource::SysfsMidr => "midr_el1",
            CpuModelSource::ProcCpuinfo => "cpuinfo",
            CpuModelSource::None => "none",
        }
    }
}

/// The machine's CPU, as far as it could be told (the first online CPU's: a Kunpeng server's
/// CPUs are all alike).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuModel {
    /// The Arm identification (from `midr_el1` or cpuinfo's `CPU …` lines).
    pub midr: Option<Midr>,
    /// x86 cpuinfo's `vendor_id` (`GenuineIntel`, `AuthenticAMD`), when there is no MIDR.
    pub vendor_id: Option<String>,
    /// cpuinfo's `model name`, when there is no MIDR.
    pub model_name: Option<String>,
    pub source: CpuModelSource,
}

impl CpuModel {
    /// Nothing known.
    pub fn unknown() -> CpuModel {
        CpuModel::default()
    }

    pub fn from_midr(midr: Midr, source: CpuModelSource) -> CpuModel {
        CpuModel {
            midr: Some(midr),
            source,
            ..CpuModel::default()
        }
    }

    pub fn known(&self) -> Option<KnownCpu> {
        self.midr.as_ref().and_then(Midr::known)
    }

    /// The implementer code as hex (`0x48`); `None` without a MIDR.
    pub fn implementer_hex(&self) -> Option<String> {
        self.midr.map(|m| format!("{:#04x}", m.implementer))
    }

    /// The part number as hex (`0xd01`); `None` without a MIDR.
    pub fn part_hex(&self) -> Option<String> {
        self.midr.map(|m| format!("{:#05x}", m.part))
    }

    /// A name for people: `HiSilicon Kunpeng 920`, `Arm part 0xd0c`, `implementer 0x12 part
    /// 0x345`, the x86 model name or vendor, or `unknown`.
    pub fn name(&self) -> String {
        if let Some(k) = self.known() {
            return k.name().to_string();
        }
        if let Some(m) = self.midr {
            return match implementer_name(m.implementer) {
                Some(n) => format!("{n} part {:#05x}", m.part),
                None => format!("implementer {:#04x} part {:#05x}", m.implementer, m.part),
            };
        }
        self.model_name
            .clone()
            .or_else(|| self.vendor_id.clone())
            .unwrap_or_else(|| "unknown".to_string())
    }

    /// A model from `/proc/cpuinfo`'s text: the first processor's `CPU implementer`,
    /// `CPU variant`, `CPU part` and `CPU revision` (Arm), else its `vendor_id` and
    /// `model name` (x86); [`CpuModel::unknown`] when it has neither.
    pub fn from_cpuinfo(text: &str) -> CpuModel {
        let midr = cpuinfo_midr(text);
        if let Some(m) = midr {
            return CpuModel::from_midr(m, CpuModelSource::ProcCpuinfo);
        }
        let vendor_id = cpuinfo_value(text, "vendor_id").and_then(clean);
        let model_name = cpuinfo_value(text, "model name").and_then(clean);
        let source = if vendor_id.is_some() || model_name.is_some() {
            CpuModelSource::ProcCpuinfo
        } else {
            CpuModelSource::None
        };
        CpuModel {
            midr: None,
            vendor_id,
            model_name,
            source,
        }
    }
}

impl fmt::Display for CpuModel {
    /// `HiSilicon Kunpeng 920 (implementer 0x48, part 0xd01, variant 0x1, revision 0)`; without
    /// a MIDR the name, and the vendor after a model name (`Intel(R) Xeon(R) … (GenuineIntel)`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())?;
        match (self.midr, &self.model_name, &self.vendor_id) {
            (Some(m), _, _) => write!(
                f,
                " (implementer {:#04x}, part {:#05x}, variant {:#x}, revision {})",
                m.implementer, m.part, m.variant, m.revision
            ),
            (None, Some(_), Some(vendor)) => write!(f, " ({vendor})"),
            (None, _, _) => Ok(()),
        }
    }
}

/// The value of the first `key : value` line with that key.
fn cpuinfo_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// A hexadecimal (`0x48`) or decimal (`0`) cpuinfo number no larger than `max`.
fn cpuinfo_number(text: &str, key: &str, max: u32) -> Option<u32> {
    let v = cpuinfo_value(text, key)?;
    let n = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
        None => v.parse::<u32>().ok()?,
    };
    (n <= max).then_some(n)
}

fn cpuinfo_midr(text: &str) -> Option<Midr> {
    let implementer = cpuinfo_number(text, "CPU implementer", 0xff)?;
    let part = cpuinfo_number(text, "CPU part", 0xfff)?;
    // The kernel always prints the variant and revision with them; 0 if a tree lacks them.
    let variant = cpuinfo_number(text, "CPU variant", 0xf).unwrap_or(0);
    let revision = cpuinfo_number(text, "CPU revision", 0xf).unwrap_or(0);
    Some(Midr {
        implementer: implementer as u8,
        variant: variant as u8,
        // cpuinfo's `CPU architecture: 8` is not the register's field, which reads 0xf
        // ("see the ID registers") on every 64-bit Arm CPU.
        architecture: 0xf,
        part: part as u16,
        revision: revision as u8,
    })
}

/// Printable text of at most [`MAX_TEXT`] characters, blanks collapsed; `None` when empty.
fn clean(s: &str) -> Option<String> {
    let joined = s
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_TEXT)
        .collect::<String>();
    (!joined.is_empty()).then_some(joined)
}

/// Something [`identify`] worked around.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CpuModelProblem {
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: String },
    #[error(
        "malformed {path} (content {content:?}): not a MIDR_EL1 value such as 0x00000000481fd010"
    )]
    MalformedMidr { path: String, content: String },
}

/// What [`identify`] found, and what it worked around.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identified {
    pub model: CpuModel,
    pub problems: Vec<CpuModelProblem>,
}

/// Where sysfs shows CPU `cpu`'s MIDR_EL1, relative to the sysfs root.
pub fn midr_path(cpu: usize) -> String {
    format!("devices/system/cpu/cpu{cpu}/regs/identification/midr_el1")
}

/// The CPU model: CPU `cpu`'s `midr_el1` under `sys` (a sysfs root), else `cpuinfo` under
/// `proc` (a proc root), else unknown. A missing file is no problem (x86 has no `midr_el1`);
/// one that cannot be read or parsed is reported and the next source tried.
pub fn identify(
    sys: &(impl FileSource + ?Sized),
    proc: &(impl FileSource + ?Sized),
    cpu: usize,
) -> Identified {
    let mut problems = Vec::new();
    let path = midr_path(cpu);
    if let Some(text) = read(sys, &path, &mut problems) {
        match Midr::parse(&text) {
            Some(m) => {
                return Identified {
                    model: CpuModel::from_midr(m, CpuModelSource::SysfsMidr),
                    problems,
                }
            }
            None => problems.push(CpuModelProblem::MalformedMidr {
                path,
                content: text.trim().chars().take(40).collect(),
            }),
        }
    }
    let model = read(proc, "cpuinfo", &mut problems)
        .map(|t| CpuModel::from_cpuinfo(&t))
        .unwrap_or_default();
    Identified { model, problems }
}

/// A file's text; `None` when missing (quietly) or unreadable (a problem).
fn read(
    src: &(impl FileSource + ?Sized),
    path: &str,
    problems: &mut Vec<CpuModelProblem>,
) -> Option<String> {
    match src.read(path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            problems.push(CpuModelProblem::Read {
                path: path.to_string(),
                error: e.to_string(),
            });
            None
        }
    }
}

crate::names! {
    /// Where cluster pools may be used when cluster affinity is asked for
    /// (`--cluster-affinity-rule`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub enum ClusterAffinityRule: "cluster affinity rule", Exact {
        /// Wherever sysfs reports clusters smaller than their NUMA node (kunpeng-tap's default).
        #[default]
        Any = "any",
        /// Only on CPU part 0xd06 (HiSilicon Kunpeng 950), as the reference does.
        Kunpeng950Only = "kunpeng-950-only",
    }
}

impl ClusterAffinityRule {
    /// Whether cluster pools may be used on `cpu`; `Err` says why not.
    pub fn check(self, cpu: &CpuModel) -> Result<(), ClustersOff> {
        match self {
            ClusterAffinityRule::Any => Ok(()),
            ClusterAffinityRule::Kunpeng950Only => match cpu.known() {
                Some(KnownCpu::Kunpeng950) => Ok(()),
                _ => Err(ClustersOff {
                    rule: self,
                    cpu: cpu.to_string(),
                }),
            },
        }
    }
}

/// Why cluster affinity was asked for but is off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClustersOff {
    pub rule: ClusterAffinityRule,
    /// The CPU, as [`CpuModel`]'s `Display` shows it.
    pub cpu: String,
}

impl fmt::Display for ClustersOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cluster affinity is off: --cluster-affinity-rule={} uses cluster pools only on CPU \
             part 0xd06 (HiSilicon Kunpeng 950), and this CPU is {}",
            self.rule, self.cpu
        )
    }
}

#[cfg(test)]
mod tests;
