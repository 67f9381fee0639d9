//! The hugepages of each NUMA node from sysfs
//! (`devices/system/node/node<N>/hugepages/hugepages-<size>kB/{nr,free}_hugepages`), for the
//! NodeResourceTopology's zones. What cannot be read is left out (a kernel without hugepages,
//! a fixture without the files).

use super::nrt::Hugepages;
use std::path::Path;

/// Every hugepage size of every NUMA node under `sysfs_root`, ordered by node and size.
pub fn read(sysfs_root: &Path) -> Vec<Hugepages> {
    let nodes = sysfs_root.join("devices/system/node");
    let Ok(dir) = std::fs::read_dir(&nodes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(node) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        out.extend(node_pages(&e.path().join("hugepages"), node));
    }
    out.sort_by_key(|h| (h.node, h.size_kb));
    out
}

fn node_pages(dir: &Path, node: u32) -> Vec<Hugepages> {
    let Ok(sizes) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let number = |p: &Path| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    sizes
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let size_kb = name
                .to_str()?
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            Some(Hugepages {
                node,
                size_kb,
                total: number(&e.path().join("nr_hugepages"))?,
                free: number(&e.path().join("free_hugepages"))?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_node_and_size_and_skips_what_is_not_there() {
        let root = std::env::temp_dir().join(format!("tap-hugepages-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let put = |rel: &str, v: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, v).expect("write");
        };
        let n = "devices/system/node";
        put(
            &format!("{n}/node1/hugepages/hugepages-2048kB/nr_hugepages"),
            "512\n",
        );
        put(
            &format!("{n}/node1/hugepages/hugepages-2048kB/free_hugepages"),
            "500\n",
        );
        put(
            &format!("{n}/node1/hugepages/hugepages-1048576kB/nr_hugepages"),
            "2\n",
        );
        put(
            &format!("{n}/node1/hugepages/hugepages-1048576kB/free_hugepages"),
            "2\n",
        );
        // Unreadable numbers and stray names are left out.
        put(
            &format!("{n}/node0/hugepages/hugepages-2048kB/nr_hugepages"),
            "x\n",
        );
        put(
            &format!("{n}/node0/hugepages/hugepages-2048kB/free_hugepages"),
            "0\n",
        );
        put(&format!("{n}/online"), "0-1\n");
        let got = read(&root);
        let names: Vec<_> = got
            .iter()
            .map(|h| (h.node, h.resource(), h.total, h.free))
            .collect();
        assert_eq!(
            names,
            [
                (1, "hugepages-2Mi".to_string(), 512, 500),
                (1, "hugepages-1Gi".to_string(), 2, 2)
            ]
        );
        assert!(read(&root.join("missing")).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}
