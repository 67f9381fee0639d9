//! The hugepages of each NUMA node from sysfs
//! (`devices/system/node/node<N>/hugepages/hugepages-<size>kB/{nr,free}_hugepages`), for the
//! NodeResourceTopology's zones. What cannot be read is left out (a kernel without hugepages,
//! a fixture without the files).

use super::nrt::Hugepages;
use std::path::Path;
use tap_engine::sysfs::{FileSource, RootSource};

/// Every hugepage size of every NUMA node under `sysfs_root` (a directory or a dump file, as
/// `--sysfs-root`), ordered by node and size.
pub fn read(sysfs_root: &Path) -> Vec<Hugepages> {
    let Ok(src) = RootSource::open(sysfs_root) else {
        return Vec::new();
    };
    let nodes = "devices/system/node";
    let Ok(names) = src.list(nodes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in names {
        let Some(node) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        out.extend(node_pages(&src, &format!("{nodes}/{name}/hugepages"), node));
    }
    out.sort_by_key(|h| (h.node, h.size_kb));
    out
}

fn node_pages(src: &RootSource, dir: &str, node: u32) -> Vec<Hugepages> {
    let Ok(sizes) = src.list(dir) else {
        return Vec::new();
    };
    let number = |p: &str| -> Option<u64> { src.read(p).ok()?.trim().parse().ok() };
    sizes
        .iter()
        .filter_map(|name| {
            let size_kb = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            Some(Hugepages {
                node,
                size_kb,
                total: number(&format!("{dir}/{name}/nr_hugepages"))?,
                free: number(&format!("{dir}/{name}/free_hugepages"))?,
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
        // The same tree as a dump file (what the repository's fixtures are).
        let mut tree = tap_engine::sysfs::MapSource::default();
        for rel in [
            "node1/hugepages/hugepages-2048kB/nr_hugepages",
            "node1/hugepages/hugepages-2048kB/free_hugepages",
            "node1/hugepages/hugepages-1048576kB/nr_hugepages",
            "node1/hugepages/hugepages-1048576kB/free_hugepages",
            "node0/hugepages/hugepages-2048kB/nr_hugepages",
            "node0/hugepages/hugepages-2048kB/free_hugepages",
            "online",
        ] {
            let text = std::fs::read_to_string(root.join(n).join(rel)).expect("read");
            tree.files.insert(format!("{n}/{rel}"), text);
        }
        let dump = root.join("dump");
        std::fs::write(&dump, tree.to_dump()).expect("write");
        assert_eq!(read(&dump), got);
        let _ = std::fs::remove_dir_all(&root);
    }
}
