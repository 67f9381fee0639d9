//! The reserved CPUs (`--reserved-cpus`, the kubelet's `reservedSystemCPUs`, a policy's
//! `reservedCPUs`): in no pool, and used only by system daemons. A container goes there when
//! its Pod's namespace is listed ([`ReservedAccess::namespaces`]) or when it asks by annotation
//! (`reserved-cpus: "true"`) and the policy honours the annotation
//! ([`ReservedAnnotation::Honoured`]). It gets all the reserved CPUs (shared with the other
//! daemons there), and with memory binding their NUMA nodes' memory; it is charged to no pool.
//! An ask that cannot be honoured (not allowed, or no reserved CPUs) leaves the container to
//! the pools, with the reason.
//!
//! [`ReservedAccess::namespaces`]: crate::types::ReservedAccess::namespaces
//! [`ReservedAnnotation::Honoured`]: crate::types::ReservedAnnotation::Honoured

use super::{with_tiers, Settings};
use crate::cpuset::CpuSet;
use crate::request::{ContainerRequest, PolicyKind};
use crate::state::StateView;
use crate::types::{Choice, Reason, ReservedAnnotation, ReservedRefusal, Site};

/// What the reserved CPUs mean for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservedUse {
    /// Placed on these CPUs (the node's reserved, online CPUs).
    Place(CpuSet),
    /// Asked for by annotation and refused: placed on the pools, with this reason.
    Refused(ReservedRefusal),
    /// Not a system daemon: the pools.
    Pools,
}

/// Whether `req` is placed on the reserved CPUs. Pure: the configuration, the Pod's namespace
/// and its annotation (`set.reserved`, already dropped when annotations are not allowed).
#[inline]
pub fn decide(view: &StateView<'_>, req: &ContainerRequest, set: &Settings) -> ReservedUse {
    let cfg = view.config();
    if set.reserved.is_none() && cfg.reserved_for.namespaces.is_empty() {
        return ReservedUse::Pools;
    }
    let listed = cfg.reserved_for.lists(&req.namespace);
    let asked = match set.reserved {
        Some(false) => return ReservedUse::Pools,
        Some(true) => true,
        None if listed => false,
        None => return ReservedUse::Pools,
    };
    if !listed && cfg.reserved_for.annotation != ReservedAnnotation::Honoured {
        return ReservedUse::Refused(ReservedRefusal::NotAllowed);
    }
    let cpus = cfg.reserved.intersection(&view.topology().online);
    match (cpus.is_empty(), asked) {
        (false, _) => ReservedUse::Place(cpus),
        (true, true) => ReservedUse::Refused(ReservedRefusal::NoneReserved),
        // A listed namespace on a node with nothing reserved: the pools, as without the list.
        (true, false) => ReservedUse::Pools,
    }
}

/// The choice of the reserved CPUs `cpus`: the root pool's name (charged nothing), the CPUs'
/// NUMA nodes, and their memory when memory is bound.
pub fn choice(view: &StateView<'_>, set: &Settings, cpus: CpuSet) -> Choice {
    let topo = view.topology();
    let nodes = topo.nodes_of(&cpus);
    let mems = set.memory.then(|| topo.mems_for_nodes(&nodes));
    let (mems, unhonoured) = with_tiers(topo, mems, set);
    Choice {
        policy: PolicyKind::TopologyAware,
        pool: 0,
        nodes,
        span: cpus,
        exclusive: CpuSet::new(),
        mems,
        charge_memory: false,
        reason: Reason::Reserved,
        unhonoured,
        site: Site::Reserved,
    }
}

#[cfg(test)]
mod tests {
    use crate::cpuset::CpuSet;
    use crate::request::{ContainerRequest, RESERVED_CPUS_KEY};
    use crate::topology::fixtures::{engine_on, machine, placed};
    use crate::types::{
        EngineConfig, Existing, Outcome, Reason, ReservedAccess, ReservedAnnotation,
        ReservedRefusal, Unhonoured,
    };
    use crate::{Engine, Overrides};
    use std::collections::HashMap;

    /// Two NUMA nodes of 4 CPUs (0-3, 4-7); `reserved` kept for `kube-system`.
    fn engine(reserved: &str, annotation: ReservedAnnotation) -> Engine {
        let cfg = EngineConfig {
            reserved: CpuSet::parse(reserved).unwrap(),
            reserved_for: ReservedAccess {
                namespaces: vec!["kube-system".into()],
                annotation,
            },
            memory_topology: true,
            ..EngineConfig::default()
        };
        engine_on(&machine(2, 1, 1, 1, 4), cfg)
    }

    fn req(id: &str, ns: &str, milli: u64, ask: Option<&str>) -> ContainerRequest {
        let ann: HashMap<String, String> = ask
            .map(|v| [(RESERVED_CPUS_KEY.to_string(), v.to_string())].into())
            .unwrap_or_default();
        ContainerRequest {
            id: id.into(),
            namespace: ns.into(),
            cpu_request_milli: milli,
            cpu_limit_milli: Some(milli),
            overrides: Overrides::from_pod(&HashMap::new(), &ann, "c").0,
            ..Default::default()
        }
    }

    #[test]
    fn a_listed_namespace_gets_exactly_the_reserved_cpus_charged_nowhere() {
        let mut e = engine("0-1", ReservedAnnotation::Ignored);
        for id in ["d1", "d2"] {
            let p = placed(e.create(&req(id, "kube-system", 2000, None)));
            assert_eq!(p.cpus.to_string(), "0-1", "{id}");
            assert_eq!(p.mems.map(|m| m.to_string()).as_deref(), Some("0"));
            assert_eq!(
                (p.reason, p.exclusive, p.unhonoured),
                (Reason::Reserved, false, None)
            );
            assert!(p.updates.is_empty());
        }
        assert_eq!(e.pool_load(0).request_milli, 0, "charged to no pool");
        let record = e.grant("d1").unwrap().record(e.topology());
        assert!(record.ends_with(";on=reserved"), "{record}");
        // A Pod of a listed namespace may decline.
        let p = placed(e.create(&req("d3", "kube-system", 1000, Some("false"))));
        assert!(!p.cpus.intersects(&CpuSet::parse("0-1").unwrap()), "{p:?}");
    }

    #[test]
    fn nobody_else_ever_gets_a_reserved_cpu_and_an_unallowed_ask_is_reported() {
        let mut e = engine("0-1", ReservedAnnotation::Ignored);
        let reserved = CpuSet::parse("0-1").unwrap();
        let p = placed(e.create(&req("ask", "shop", 500, Some("true"))));
        assert!(!p.cpus.intersects(&reserved), "{p:?}");
        let refused = Unhonoured::ReservedCpus(ReservedRefusal::NotAllowed);
        assert_eq!(p.unhonoured, Some(refused));
        assert_eq!(refused.kind(), "reserved_cpus");
        // Shared, exclusive (the kubelet's pinning) and BestEffort, up to the whole machine.
        for (i, milli) in [1000, 2000, 500, 0, 6000, 8000].into_iter().enumerate() {
            let o = e.create(&req(&format!("c{i}"), "shop", milli, None));
            if let Outcome::Placed(p) = o {
                assert!(!p.cpus.intersects(&reserved), "c{i}: {p:?}");
                assert!(p.updates.iter().all(|u| !u.cpus.intersects(&reserved)));
            }
        }
        assert!(
            !e.taken().intersects(&reserved),
            "exclusive grants took {}",
            e.taken()
        );
    }

    #[test]
    fn the_annotation_counts_where_the_policy_honours_it() {
        let mut e = engine("6-7", ReservedAnnotation::Honoured);
        let p = placed(e.create(&req("a", "monitoring", 100, Some("true"))));
        assert_eq!(p.cpus.to_string(), "6-7");
        assert_eq!(p.mems.map(|m| m.to_string()).as_deref(), Some("1"));
        let p = placed(e.create(&req("b", "monitoring", 100, None)));
        assert!(!p.cpus.intersects(&CpuSet::parse("6-7").unwrap()), "{p:?}");
    }

    #[test]
    fn with_no_reserved_cpus_an_ask_is_refused_with_the_reason() {
        let mut e = engine("", ReservedAnnotation::Honoured);
        let p = placed(e.create(&req("a", "kube-system", 1000, Some("true"))));
        assert_eq!(
            p.unhonoured,
            Some(Unhonoured::ReservedCpus(ReservedRefusal::NoneReserved))
        );
        // A listed namespace without an ask: placed as ever, nothing to report.
        let p = placed(e.create(&req("b", "kube-system", 1000, None)));
        assert_eq!((p.reason, p.unhonoured), (Reason::KubeSystem, None));
        // Reserved CPUs that are all offline are none.
        let mut e = engine("100-101", ReservedAnnotation::Honoured);
        let p = placed(e.create(&req("c", "kube-system", 1000, Some("true"))));
        assert_eq!(
            p.unhonoured,
            Some(Unhonoured::ReservedCpus(ReservedRefusal::NoneReserved))
        );
    }

    #[test]
    fn a_node_of_reserved_cpus_only_still_places_its_daemons() {
        let mut e = engine("0-7", ReservedAnnotation::Ignored);
        let p = placed(e.create(&req("d", "kube-system", 100, None)));
        assert_eq!(p.cpus.to_string(), "0-7");
        assert!(matches!(
            e.create(&req("x", "shop", 100, None)),
            Outcome::Skipped(_)
        ));
    }

    #[test]
    fn a_restart_keeps_daemons_on_the_reserved_cpus_by_record_or_by_cpuset() {
        let mut e = engine("0-1", ReservedAnnotation::Ignored);
        let daemon = req("d", "kube-system", 500, None);
        placed(e.create(&daemon));
        let record = e.record("d");
        let existing = |id: &str, ns: &str, record: Option<String>| Existing {
            request: req(id, ns, 500, None),
            cpus: Some(CpuSet::parse("0-1").unwrap()),
            mems: None,
            record,
        };
        let mut fresh = engine("0-1", ReservedAnnotation::Ignored);
        let report = fresh.restore(&[
            existing("d", "kube-system", record),
            existing("i", "kube-system", None),
            existing("s", "shop", None),
        ]);
        for id in ["d", "i"] {
            let g = fresh.grant(id).unwrap();
            assert!(g.is_reserved(), "{id}: {g:?}");
            assert_eq!(g.cpus.to_string(), "0-1");
        }
        assert_eq!(
            fresh.pool_load(0).request_milli,
            500,
            "only the shop container"
        );
        // The shop container is moved off the reserved CPUs; the daemons are left alone.
        let ids: Vec<_> = report.updates.iter().map(|u| &*u.container_id).collect();
        assert_eq!(ids, ["s"]);
        assert!(!report.updates[0]
            .cpus
            .intersects(&CpuSet::parse("0-1").unwrap()));
    }
}
