//! Where a model's nodes run. A session on a GPU provider may still run
//! some nodes on the CPU (those the GPU provider has no kernel for), with
//! copies between the devices on every run: int8 models' integer ops are
//! the common case (12 ms on CPU became 232 ms on a GPU in onnxruntime
//! issue #10267). ONNX Runtime says where each node ran in its profile:
//! the session is profiled for one warm-up run ([`Placement::of_profile`]
//! reads the file), and the nodes on another provider than the session's
//! are reported ([`Placement::off_provider`]).

use std::collections::BTreeMap;

/// How many nodes ran on each provider, by op type.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    /// (provider, op type) → node executions seen.
    pub nodes: BTreeMap<(String, String), usize>,
}

/// A profile that could not be read as one.
#[derive(Debug, thiserror::Error)]
#[error("cannot read ONNX Runtime's profile {path}: {why}")]
pub struct ProfileError {
    pub path: String,
    pub why: String,
}

impl Placement {
    /// The nodes of an ONNX Runtime profile (a JSON array of trace events;
    /// a node's have `"cat": "Node"` and `args.provider`, `args.op_name`).
    pub fn of_profile(json: &str) -> Result<Placement, String> {
        let events: Vec<serde_json::Value> =
            serde_json::from_str(json).map_err(|e| e.to_string())?;
        let mut nodes = BTreeMap::new();
        for e in events.iter().filter(|e| e["cat"] == "Node") {
            let args = &e["args"];
            let (Some(provider), Some(op)) = (args["provider"].as_str(), args["op_name"].as_str())
            else {
                continue;
            };
            // A node's kernel run, not its fence or launch events.
            let kernel = e["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("_kernel_time"));
            if kernel {
                *nodes
                    .entry((provider.to_string(), op.to_string()))
                    .or_insert(0) += 1;
            }
        }
        Ok(Placement { nodes })
    }

    /// Reads and removes the profile file ONNX Runtime wrote.
    pub fn take_file(path: &str) -> Result<Placement, ProfileError> {
        let failed = |why: String| ProfileError {
            path: path.to_string(),
            why,
        };
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        let _ = std::fs::remove_file(path);
        Placement::of_profile(&text).map_err(failed)
    }

    /// The op types (with their node counts) that ran on another provider
    /// than `session`, the one that runs the session; none for a CPU
    /// session.
    pub fn off_provider(&self, session: &str) -> Vec<(String, usize)> {
        if session == CPU {
            return Vec::new();
        }
        let mut ops: BTreeMap<String, usize> = BTreeMap::new();
        for ((provider, op), n) in &self.nodes {
            if provider != session {
                *ops.entry(op.clone()).or_insert(0) += n;
            }
        }
        ops.into_iter().collect()
    }

    /// One line per provider: its node runs and op types.
    pub fn lines(&self) -> Vec<String> {
        let mut by: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for ((provider, op), n) in &self.nodes {
            by.entry(provider).or_default().push(format!("{op} ×{n}"));
        }
        by.into_iter()
            .map(|(provider, ops)| format!("{provider}: {}", ops.join(", ")))
            .collect()
    }
}

/// ONNX Runtime's name of the CPU provider.
pub const CPU: &str = "CPUExecutionProvider";

/// The provider as configuration and metrics name it (`cpu`, `cuda`,
/// `tensorrt`), from ONNX Runtime's name.
pub fn short_name(provider: &str) -> &'static str {
    match provider {
        "CUDAExecutionProvider" => "cuda",
        "TensorrtExecutionProvider" => "tensorrt",
        _ => "cpu",
    }
}

/// Op types of a dynamically quantized (int8) graph: on a GPU provider
/// they are not GPU kernels and run on the CPU.
pub const INT8_OPS: [&str; 5] = [
    "DynamicQuantizeLinear",
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "ConvInteger",
    "DynamicQuantizeMatMul",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile as ONNX Runtime writes it for a CUDA session whose int8
    /// ops fell back to the CPU (trimmed to the fields read).
    const MIXED: &str = r#"[
        {"cat": "Session", "name": "model_run", "args": {}},
        {"cat": "Node", "name": "MatMul_1_kernel_time", "args": {"op_name": "MatMul", "provider": "CUDAExecutionProvider"}},
        {"cat": "Node", "name": "MatMul_1_fence_before", "args": {"op_name": "MatMul", "provider": "CUDAExecutionProvider"}},
        {"cat": "Node", "name": "q_kernel_time", "args": {"op_name": "DynamicQuantizeLinear", "provider": "CPUExecutionProvider"}},
        {"cat": "Node", "name": "mm_kernel_time", "args": {"op_name": "MatMulInteger", "provider": "CPUExecutionProvider"}},
        {"cat": "Node", "name": "mm2_kernel_time", "args": {"op_name": "MatMulInteger", "provider": "CPUExecutionProvider"}}
    ]"#;

    #[test]
    fn nodes_off_a_gpu_sessions_provider_are_named_by_op_type() {
        let p = Placement::of_profile(MIXED).unwrap();
        assert_eq!(
            p.off_provider("CUDAExecutionProvider"),
            vec![
                ("DynamicQuantizeLinear".into(), 1),
                ("MatMulInteger".into(), 2)
            ]
        );
        assert!(
            p.off_provider(CPU).is_empty(),
            "a CPU session has no fallback"
        );
        assert_eq!(
            p.lines(),
            vec![
                "CPUExecutionProvider: DynamicQuantizeLinear ×1, MatMulInteger ×2".to_string(),
                "CUDAExecutionProvider: MatMul ×1".to_string()
            ]
        );
    }

    #[test]
    fn a_profile_that_is_not_one_is_an_error() {
        assert!(Placement::of_profile("not json").is_err());
        assert_eq!(short_name("CPUExecutionProvider"), "cpu");
        assert_eq!(short_name("CUDAExecutionProvider"), "cuda");
    }
}
