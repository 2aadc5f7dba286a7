//! How the inference sessions run: how many (`workers`), and the ONNX
//! Runtime session options that change speed or memory
//! (`[inference.session]`; each default comes from a measurement in
//! docs/benchmarks.md, "Session options").

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{ExecutionProvider, InferenceSettings, UNKNOWN_VALUE};

choice! {
    /// ONNX Runtime's graph optimization level.
    GraphOptimization { Disabled = "disabled", Basic = "basic", Extended = "extended", All = "all" }
}

choice! {
    /// ONNX Runtime's CPU memory arena: "auto" is off for token models (less
    /// peak memory at the same speed, as measured) and on for text models
    /// (the other way round).
    MemoryArena { Auto = "auto", On = "on", Off = "off" }
}

/// `[inference.session]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionOptions {
    pub graph_optimization: GraphOptimization,
    /// With `intra_threads` > 1: the intra-op threads spin waiting for work
    /// between runs (faster hand-off, CPU burnt while idle).
    pub spinning: bool,
    /// ONNX Runtime's CPU memory arena (buffers kept for reuse).
    pub memory_arena: MemoryArena,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            graph_optimization: GraphOptimization::All,
            spinning: false,
            memory_arena: MemoryArena::Auto,
        }
    }
}

/// How many inference sessions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// As many as serve the hardware (see [`InferenceSettings::worker_count`]).
    Auto,
    Count(usize),
}

impl Serialize for Workers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Workers::Auto => s.serialize_str("auto"),
            Workers::Count(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Workers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Count(usize),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Count(n) => Ok(Workers::Count(n)),
            Repr::Text(t) if t.trim() == "auto" => Ok(Workers::Auto),
            // Environment variables arrive as text.
            Repr::Text(t) => t.trim().parse().map(Workers::Count).map_err(|_| {
                serde::de::Error::custom(format!("{UNKNOWN_VALUE} {t:?}; use \"auto\" or a number"))
            }),
        }
    }
}

impl InferenceSettings {
    /// The number of sessions. "auto": on CPU, the cores this process may
    /// use (affinity and cgroup quota, as the standard library reads them)
    /// divided by `intra_threads`, 1 to 64; on a GPU provider, 1 per device
    /// (not measured yet: scripts/gpu-check.sh is the way to find better).
    ///
    /// `"auto"` reads the cgroup files on every call: resolve it once.
    pub fn worker_count(&self) -> usize {
        match self.workers {
            Workers::Count(n) => n,
            Workers::Auto => {
                let gpu = self
                    .execution_providers
                    .first()
                    .is_some_and(|p| *p != ExecutionProvider::Cpu);
                if gpu {
                    return 1;
                }
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                (cores / self.intra_threads.max(1)).clamp(1, 64)
            }
        }
    }
}
