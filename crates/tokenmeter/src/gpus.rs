//! How many GPUs are behind this proxy (`--gpus`), found on their own when not given.
//!
//! The number divides throughput into tokens/s per GPU and multiplies `--gpu-hour-cost` into
//! the cost per million tokens, so a wrong number is a wrong figure on every dashboard. It is
//! taken from the first of these that says something, and `tokenmeter_gpus{source}` says which:
//!
//! 1. `flag`: `--gpus N` (or `TOKENMETER_GPUS`, which the sidecar overlay sets from the vLLM
//!    container's `nvidia.com/gpu` limit);
//! 2. `nvidia_visible_devices`: the entries of `NVIDIA_VISIBLE_DEVICES`, which the NVIDIA
//!    container runtime and the Kubernetes device plugin set to the GPUs given to a container;
//! 3. `cuda_visible_devices`: the entries of `CUDA_VISIBLE_DEVICES`, as CUDA reads them (up to
//!    the first invalid one);
//! 4. `file`: a number in the file named by `--gpus-file` / `TOKENMETER_GPUS_FILE`, e.g. a pod
//!    annotation mounted with the Downward API (which cannot expose `nvidia.com/gpu` itself);
//! 5. `default`: 1, with a warning.
//!
//! `void`, `none` and an empty value mean "no GPU in this container" to the NVIDIA runtime;
//! they are logged and the next source is asked (tokenmeter may run in a container of its own
//! beside the one holding the GPUs). `all` means every GPU of the machine. Without nvidia-smi
//! (not in tokenmeter's image) the GPUs are counted as the `/dev/nvidia<N>` device nodes the
//! runtime mounts, one per GPU given to the container; when there are none the next source is
//! asked. Each of these decisions is returned as a [`Note`] for the caller to log.

use std::path::Path;

use crate::host::Host;

/// Where the GPU count came from: the `source` label of `tokenmeter_gpus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    NvidiaVisibleDevices,
    CudaVisibleDevices,
    File,
    Default,
}

impl Source {
    /// Every value, in the order they are asked.
    pub const ALL: [Source; 5] = [
        Source::Flag,
        Source::NvidiaVisibleDevices,
        Source::CudaVisibleDevices,
        Source::File,
        Source::Default,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::NvidiaVisibleDevices => "nvidia_visible_devices",
            Source::CudaVisibleDevices => "cuda_visible_devices",
            Source::File => "file",
            Source::Default => "default",
        }
    }
}

/// Something detection decided that the operator should see in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// A warning (the figure may be wrong) rather than information.
    pub warn: bool,
    pub text: String,
}

/// The GPU count and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpus {
    pub count: f64,
    pub source: Source,
    /// What was looked at and why it was taken or passed over, in order.
    pub notes: Vec<Note>,
}

/// Why `--gpus` or its file was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GpuError {
    #[error("--gpus must be auto or a positive number, got {0:?}")]
    BadFlag(String),
    #[error("--gpus-file {path}: {why}")]
    BadFile { path: String, why: String },
}

/// Where the device nodes are.
const DEV: &str = "/dev";

/// A positive, finite number of GPUs (fractions are allowed: a MIG slice or a shared GPU).
fn positive(s: &str) -> Option<f64> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite() && *n > 0.0)
}

/// `--gpus` (`auto` or a number), with `--gpus-file`, read from `host`.
pub fn detect(flag: &str, file: Option<&Path>, host: &dyn Host) -> Result<Gpus, GpuError> {
    if !flag.trim().eq_ignore_ascii_case("auto") {
        let count = positive(flag).ok_or_else(|| GpuError::BadFlag(flag.to_string()))?;
        return Ok(Gpus {
            count,
            source: Source::Flag,
            notes: Vec::new(),
        });
    }
    let mut notes = Vec::new();
    for (var, source) in [
        ("NVIDIA_VISIBLE_DEVICES", Source::NvidiaVisibleDevices),
        ("CUDA_VISIBLE_DEVICES", Source::CudaVisibleDevices),
    ] {
        let Some(value) = host.var(var) else {
            continue;
        };
        if let Some(count) = visible_devices(var, &value, source, host, &mut notes) {
            notes.push(Note {
                warn: false,
                text: format!("{count} GPUs from {var}"),
            });
            return Ok(Gpus {
                count: count as f64,
                source,
                notes,
            });
        }
    }
    if let Some(path) = file {
        let bad = |why: String| GpuError::BadFile {
            path: path.display().to_string(),
            why,
        };
        let text = host
            .read_file(path)
            .map_err(|e| bad(format!("cannot read it: {e}")))?;
        let count = positive(&text).ok_or_else(|| {
            bad(format!(
                "holds {:?}, not a positive number",
                text.trim().chars().take(40).collect::<String>()
            ))
        })?;
        notes.push(Note {
            warn: false,
            text: format!("{count} GPUs from {}", path.display()),
        });
        return Ok(Gpus {
            count,
            source: Source::File,
            notes,
        });
    }
    notes.push(Note {
        warn: true,
        text: "no GPU count found (--gpus, NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, \
               --gpus-file): assuming 1; per-GPU figures are per process until it is set"
            .to_string(),
    });
    Ok(Gpus {
        count: 1.0,
        source: Source::Default,
        notes,
    })
}

/// The GPUs a `*_VISIBLE_DEVICES` value names, or `None` (with a note) when it names none.
fn visible_devices(
    var: &str,
    value: &str,
    source: Source,
    host: &dyn Host,
    notes: &mut Vec<Note>,
) -> Option<usize> {
    let mut pass = |why: &str| {
        notes.push(Note {
            warn: false,
            text: format!("{var}={value:?}: {why}; asking the next source"),
        });
        None
    };
    let v = value.trim();
    match v.to_ascii_lowercase().as_str() {
        "" | "void" => return pass("no GPU in this container"),
        "none" => return pass("the driver without any GPU"),
        "all" => {
            let n = device_nodes(host);
            if n == 0 {
                return pass("every GPU, but no /dev/nvidia<N> device to count");
            }
            notes.push(Note {
                warn: false,
                text: format!("{var}=all: counted {n} /dev/nvidia<N> devices"),
            });
            return Some(n);
        }
        _ => {}
    }
    let entries = v.split(',').map(str::trim);
    let n = match source {
        // CUDA stops at the first entry it cannot read (`-1` is the usual way to hide the rest).
        Source::CudaVisibleDevices => entries.take_while(|e| cuda_entry(e)).count(),
        _ => entries.filter(|e| !e.is_empty()).count(),
    };
    if n == 0 {
        return pass("no usable entry");
    }
    Some(n)
}

/// An entry CUDA accepts: a device index, a GPU UUID or a MIG instance.
fn cuda_entry(e: &str) -> bool {
    (!e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()))
        || e.starts_with("GPU-")
        || e.starts_with("MIG-")
}

/// The `/dev/nvidia<N>` nodes (not `nvidiactl`, `nvidia-uvm`, `nvidia-modeset`).
fn device_nodes(host: &dyn Host) -> usize {
    host.list_dir(Path::new(DEV)).map_or(0, |entries| {
        entries
            .iter()
            .filter(|e| {
                e.strip_prefix("nvidia")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .count()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::MapHost;

    fn auto(host: &MapHost) -> Gpus {
        detect("auto", None, host).expect("detect")
    }

    #[test]
    fn a_number_is_the_flag_and_nonsense_is_refused() {
        let host = MapHost::default().var("NVIDIA_VISIBLE_DEVICES", "0,1,2");
        let g = detect("4", None, &host).expect("flag");
        assert_eq!((g.count, g.source), (4.0, Source::Flag));
        assert_eq!(detect("0.5", None, &host).expect("mig").count, 0.5);
        for bad in ["0", "-2", "many", "", "inf", "NaN"] {
            assert_eq!(
                detect(bad, None, &host),
                Err(GpuError::BadFlag(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(detect("AUTO", None, &host).expect("auto").count, 3.0);
    }

    #[test]
    fn nvidia_visible_devices_counts_its_entries() {
        for (value, n) in [
            ("0", 1),
            ("0,1,2,3", 4),
            ("GPU-8a3c, GPU-77b1", 2),
            ("MIG-1f2e,MIG-4a5b,0", 3),
            ("0,,1", 2),
        ] {
            let g = auto(&MapHost::default().var("NVIDIA_VISIBLE_DEVICES", value));
            assert_eq!(
                (g.count, g.source),
                (n as f64, Source::NvidiaVisibleDevices),
                "{value}"
            );
        }
    }

    #[test]
    fn all_counts_device_nodes_and_void_or_none_ask_the_next_source() {
        let dev = [
            "nvidia0",
            "nvidia1",
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-modeset",
            "null",
        ];
        let host = MapHost::default()
            .var("NVIDIA_VISIBLE_DEVICES", "all")
            .dir("/dev", &dev);
        let g = auto(&host);
        assert_eq!((g.count, g.source), (2.0, Source::NvidiaVisibleDevices));
        assert!(g.notes[0].text.contains("counted 2"), "{:?}", g.notes);

        // `all` with no device node to count: the next source, with a note saying why.
        let host = MapHost::default()
            .var("NVIDIA_VISIBLE_DEVICES", "all")
            .var("CUDA_VISIBLE_DEVICES", "0,1,2")
            .dir("/dev", &["null"]);
        let g = auto(&host);
        assert_eq!((g.count, g.source), (3.0, Source::CudaVisibleDevices));
        assert!(
            g.notes[0].text.contains("no /dev/nvidia<N>"),
            "{:?}",
            g.notes
        );

        for value in ["void", "none", "", "  "] {
            let host = MapHost::default()
                .var("NVIDIA_VISIBLE_DEVICES", value)
                .var("CUDA_VISIBLE_DEVICES", "3");
            let g = auto(&host);
            assert_eq!(
                (g.count, g.source),
                (1.0, Source::CudaVisibleDevices),
                "{value:?}"
            );
            assert!(g.notes[0].text.contains("next source"), "{:?}", g.notes);
        }
    }

    #[test]
    fn cuda_visible_devices_stops_at_the_first_invalid_entry() {
        for (value, n) in [
            ("0,1", 2.0),
            ("2,3,-1,4", 2.0),
            ("GPU-1234,MIG-5678", 2.0),
            ("1, 0", 2.0),
        ] {
            let g = auto(&MapHost::default().var("CUDA_VISIBLE_DEVICES", value));
            assert_eq!(
                (g.count, g.source),
                (n, Source::CudaVisibleDevices),
                "{value}"
            );
        }
        // `-1` hides every GPU: nothing from CUDA, so the default.
        let g = auto(&MapHost::default().var("CUDA_VISIBLE_DEVICES", "-1"));
        assert_eq!((g.count, g.source), (1.0, Source::Default));
        assert!(g.notes.iter().any(|n| n.text.contains("no usable entry")));
    }

    #[test]
    fn the_file_comes_after_the_variables_and_must_hold_a_number() {
        let path = Path::new("/etc/podinfo/gpus");
        let host = MapHost::default().file("/etc/podinfo/gpus", "8\n");
        let g = detect("auto", Some(path), &host).expect("file");
        assert_eq!((g.count, g.source), (8.0, Source::File));

        let host = host.var("NVIDIA_VISIBLE_DEVICES", "0,1");
        let g = detect("auto", Some(path), &host).expect("env first");
        assert_eq!(g.source, Source::NvidiaVisibleDevices);

        let host = MapHost::default().file("/etc/podinfo/gpus", "\"eight\"");
        let e = detect("auto", Some(path), &host).expect_err("not a number");
        assert_eq!(
            e.to_string(),
            "--gpus-file /etc/podinfo/gpus: holds \"\\\"eight\\\"\", not a positive number"
        );
        let e = detect("auto", Some(path), &MapHost::default()).expect_err("missing");
        assert!(e.to_string().contains("cannot read it"), "{e}");
    }

    #[test]
    fn nothing_found_is_one_gpu_with_a_warning() {
        let g = auto(&MapHost::default());
        assert_eq!((g.count, g.source), (1.0, Source::Default));
        assert_eq!(g.notes.len(), 1);
        assert!(g.notes[0].warn);
    }

    #[test]
    fn source_labels_are_the_documented_ones() {
        let names: Vec<_> = Source::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "flag",
                "nvidia_visible_devices",
                "cuda_visible_devices",
                "file",
                "default"
            ]
        );
    }
}
