//! Docs that are generated from a source in the repository are up to date.

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every node label of docs/architecture.dot appears in docs/architecture.svg: a picture
/// regenerated after the last edit of its source (`bash hack/gen-architecture.sh`).
#[test]
fn architecture_picture_matches_its_source() {
    let dot = std::fs::read_to_string(root().join("docs/architecture.dot")).expect("dot");
    let svg = std::fs::read_to_string(root().join("docs/architecture.svg")).expect("svg");
    let mut labels = 0;
    for part in dot.split("label=\"").skip(1) {
        let label = part.split('"').next().unwrap_or_default();
        for line in label.split("\\n").filter(|l| !l.is_empty()) {
            // Graphviz escapes these in SVG text.
            let escaped = line
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('-', "&#45;");
            assert!(
                svg.contains(&escaped),
                "{line:?} is in architecture.dot but not in architecture.svg: run hack/gen-architecture.sh"
            );
            labels += 1;
        }
    }
    assert!(
        labels > 20,
        "parsed only {labels} labels from architecture.dot"
    );
}
