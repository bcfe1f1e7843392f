//! Saving and loading parameters and optimizer state as plain safetensors files (the crate
//! `safetensors`): F32 little-endian, the standard header (8-byte little-endian length, JSON,
//! data), free-form metadata as the `__metadata__` string map. numpy and PyTorch read them
//! unchanged.
//!
//! [`save`] is atomic: it writes `<path>.<pid>.<n>.tmp`, syncs it to disk, renames it over `path` and
//! syncs the directory, so a crash leaves the old file or the new one, never half of one; a
//! failed write (a full disk) removes its temporary file. [`serialize`] and [`write_atomic`]
//! are its two halves, for a caller that checks the room it needs in between.
//! [`load`] treats the file as hostile: it checks the header length against a cap and against
//! the file length *before* allocating anything sized by the file's claims, then lets
//! `safetensors` validate every offset and byte count. [`load_into`] checks every name, shape
//! and dtype before it writes a single parameter.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use plimsoll_autograd::{DType, Gpu, Tensor, TensorOptions};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{Error, Result};

/// The largest header [`load`] accepts (the `safetensors` crate's own cap, 100 MB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor read from a file, on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Extents, outermost first.
    pub shape: Vec<usize>,
    /// Row-major values (`shape.iter().product()` of them).
    pub data: Vec<f32>,
    /// How the file stores the values.
    pub stored: Stored,
}

impl HostTensor {
    /// `data` of `shape`, stored as F32.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> HostTensor {
        HostTensor {
            shape,
            data,
            stored: Stored::F32,
        }
    }
}

/// How a [`HostTensor`]'s values are stored in a file. Every value is an f32 in memory; a
/// count that PyTorch keeps as an integer (BatchNorm's `num_batches_tracked`, a 0-d `int64`)
/// is written as I64 so that `load_state_dict(..., strict=True)` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stored {
    /// 32-bit floats.
    #[default]
    F32,
    /// 64-bit signed integers (each value rounded to the nearest; exact up to 2^24).
    I64,
}

/// The contents of a state file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadedState {
    /// Tensors by (dotted) name.
    pub tensors: BTreeMap<String, HostTensor>,
    /// The `__metadata__` map (empty when the file has none).
    pub metadata: BTreeMap<String, String>,
}

impl LoadedState {
    /// The entries whose names start with `prefix`, with the prefix removed (the same
    /// metadata): for a file holding parameters and optimizer state under separate prefixes.
    pub fn strip_prefix(&self, prefix: &str) -> LoadedState {
        LoadedState {
            tensors: self
                .tensors
                .iter()
                .filter_map(|(name, t)| {
                    name.strip_prefix(prefix)
                        .map(|rest| (rest.to_string(), t.clone()))
                })
                .collect(),
            metadata: self.metadata.clone(),
        }
    }

    /// Every tensor uploaded to `gpu` as `options` says (labelled by its name when
    /// `options.label` is empty), in name order: e.g. the state for
    /// [`crate::Optimizer::load_state`].
    pub fn to_device(
        &self,
        gpu: &Gpu,
        options: TensorOptions<'_>,
    ) -> Result<Vec<(String, Tensor)>> {
        self.tensors
            .iter()
            .map(|(name, t)| {
                let label = if options.label.is_empty() {
                    name.as_str()
                } else {
                    options.label
                };
                let options = TensorOptions { label, ..options };
                Ok((
                    name.clone(),
                    Tensor::from_slice_with(gpu, &t.data, &t.shape, options)?,
                ))
            })
            .collect()
    }
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}

/// `path` with `.<process id>.<n>.tmp` appended to its file name: unique to this save, so two
/// saves to one path at once (two runs sharing a checkpoint folder, two threads) never write
/// into the same temporary file, and the last rename wins with a whole file.
fn temporary_path(path: &Path) -> PathBuf {
    static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{}.{n}.tmp", std::process::id()));
    PathBuf::from(name)
}

/// Saves `tensors` (f32, read back from the GPU) under their names, with `metadata`, to `path`
/// atomically. Errors: a duplicate name, a non-f32 tensor, a read-back or an I/O failure.
pub fn save(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let bytes = serialize(path, tensors, metadata)?;
    write_atomic(path, &bytes)
}

/// The bytes [`save`] would write to `path` (named in errors only): for a caller that checks
/// the room they need before [`write_atomic`]. Errors as [`save`]'s, I/O aside.
pub fn serialize(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut host = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if t.dtype() != DType::F32 {
            return Err(Error::DType {
                name: name.clone(),
                found: format!("{:?}", t.dtype()),
            });
        }
        let shape = t.shape().to_vec();
        host.push((name.clone(), HostTensor::new(shape, t.to_vec()?)));
    }
    serialize_host(path, host.iter().map(|(n, t)| (n, t)), metadata)
}

/// [`serialize`] of tensors already on the host. Errors: a duplicate name, a shape that does
/// not fit its values.
pub fn serialize_host<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a String, &'a HostTensor)>,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut seen = std::collections::BTreeSet::new();
    let mut host: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = Vec::new();
    for (name, t) in tensors {
        if !seen.insert(name.as_str()) {
            return Err(Error::InvalidConfig {
                what: "state::save",
                message: format!("the name {name:?} appears twice; names must be unique"),
            });
        }
        let (dtype, bytes): (Dtype, Vec<u8>) = match t.stored {
            Stored::F32 => (
                Dtype::F32,
                t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            Stored::I64 => (
                Dtype::I64,
                t.data
                    .iter()
                    .flat_map(|v| (v.round() as i64).to_le_bytes())
                    .collect(),
            ),
        };
        host.push((name.clone(), t.shape.clone(), dtype, bytes));
    }
    let views = host
        .iter()
        .map(|(name, shape, dtype, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|view| (name.as_str(), view))
                .map_err(|e| Error::Corrupt {
                    path: path.to_path_buf(),
                    reason: format!("cannot describe {name:?}: {e}"),
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut info: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let digest = tensor_digest(
        host.iter()
            .map(|(n, s, _, b)| (n.as_str(), s.as_slice(), b.as_slice())),
    );
    info.insert(DIGEST_KEY.to_string(), digest);
    let info = Some(info);
    safetensors::serialize(views, info).map_err(|e| Error::Corrupt {
        path: path.to_path_buf(),
        reason: format!("serialising: {e}"),
    })
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, synced, renamed over
/// `path`, then the directory synced. On any failure (create, write, sync, rename) the
/// temporary file is removed, so a full disk leaves the old file and nothing else.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temporary_path(path);
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(io("create", &tmp))
        .and_then(|mut file| {
            file.write_all(bytes).map_err(io("write", &tmp))?;
            file.sync_all().map_err(io("sync", &tmp))
        })
        .and_then(|()| fs::rename(&tmp, path).map_err(io("rename into place", path)));
    if let Err(e) = written {
        // Whatever part of it exists is useless; the error above is the one to report.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // Make the rename itself durable. Directories cannot be opened everywhere (Windows), and
    // the file is already complete, so a failure here is not an error.
    if let Some(Ok(d)) = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(File::open)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Opens a state file and checks its header length against [`MAX_HEADER_BYTES`] and the
/// file's length; returns the file (positioned after the 8 length bytes), its length and the
/// length bytes.
fn open_checked(path: &Path) -> Result<(File, u64, [u8; 8])> {
    let mut file = File::open(path).map_err(io("open", path))?;
    let file_bytes = file.metadata().map_err(io("stat", path))?.len();
    if file_bytes < 8 {
        return Err(Error::Truncated {
            path: path.to_path_buf(),
            file_bytes,
            needed_bytes: 8,
        });
    }
    let mut length = [0u8; 8];
    file.read_exact(&mut length).map_err(io("read", path))?;
    let header_bytes = u64::from_le_bytes(length);
    if header_bytes > MAX_HEADER_BYTES {
        return Err(Error::HeaderTooLarge {
            path: path.to_path_buf(),
            header_bytes,
            max_bytes: MAX_HEADER_BYTES,
        });
    }
    if 8 + header_bytes > file_bytes {
        return Err(Error::Truncated {
            path: path.to_path_buf(),
            file_bytes,
            needed_bytes: 8 + header_bytes,
        });
    }
    Ok((file, file_bytes, length))
}

/// The metadata key under which [`save`] writes the SHA-256 of the file's tensors
/// ([`tensor_digest`]), and which [`load`] checks: a file altered in place after it was saved
/// (a value edited, bytes flipped) is refused as [`Error::Corrupt`], where safetensors alone
/// would load it. Files without it (other tools', older versions') load as before.
pub const DIGEST_KEY: &str = "plimsoll.sha256_of_tensors";

/// The SHA-256, in hex, of `tensors` taken in name order: each one's name, dimensions (as
/// little-endian `u64`s) and data bytes, each part preceded by its length.
pub fn tensor_digest<'a>(
    tensors: impl Iterator<Item = (&'a str, &'a [usize], &'a [u8])>,
) -> String {
    use sha2::Digest;
    let mut sorted: Vec<_> = tensors.collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut hash = sha2::Sha256::new();
    for (name, shape, data) in sorted {
        hash.update((name.len() as u64).to_le_bytes());
        hash.update(name.as_bytes());
        hash.update((shape.len() as u64).to_le_bytes());
        for d in shape {
            hash.update((*d as u64).to_le_bytes());
        }
        hash.update((data.len() as u64).to_le_bytes());
        hash.update(data);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The `__metadata__` map of a state file, reading its header alone (not the tensors): what
/// listing many checkpoints needs. Errors as [`load`]'s for the header.
pub fn metadata(path: &Path) -> Result<BTreeMap<String, String>> {
    let (mut file, _, length) = open_checked(path)?;
    let mut header = vec![0u8; u64::from_le_bytes(length) as usize];
    file.read_exact(&mut header).map_err(io("read", path))?;
    let corrupt = |reason: String| Error::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let mut value: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| corrupt(e.to_string()))?;
    let mut map: BTreeMap<String, String> = match value
        .get_mut("__metadata__")
        .map(serde_json::Value::take)
    {
        None => BTreeMap::new(),
        Some(m) => serde_json::from_value(m).map_err(|e| corrupt(format!("__metadata__: {e}")))?,
    };
    // As `load` gives it: the digest is the file's own business (checked on load).
    map.remove(DIGEST_KEY);
    Ok(map)
}

/// Loads a state file. Errors: [`Error::Io`], [`Error::Truncated`] (shorter than its header
/// says), [`Error::HeaderTooLarge`] (header length over [`MAX_HEADER_BYTES`]),
/// [`Error::Corrupt`] (bad JSON, offsets past the end or overlapping, byte counts that do not
/// match the shapes), [`Error::DType`] (an entry neither F32 nor I64). Never panics, and allocates
/// no more than the file's actual length.
pub fn load(path: &Path) -> Result<LoadedState> {
    let (mut file, file_bytes, length) = open_checked(path)?;
    // Sized by the file's real length, which the file system vouches for.
    let mut bytes = Vec::with_capacity(usize::try_from(file_bytes).unwrap_or(0));
    bytes.extend_from_slice(&length);
    file.read_to_end(&mut bytes).map_err(io("read", path))?;
    let corrupt = |e: safetensors::SafeTensorError| Error::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(corrupt)?;
    let parsed = SafeTensors::deserialize(&bytes).map_err(corrupt)?;
    let mut tensors = BTreeMap::new();
    for (name, view) in parsed.iter() {
        let (stored, data): (Stored, Vec<f32>) = match view.dtype() {
            Dtype::F32 => (
                Stored::F32,
                view.data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            Dtype::I64 => (
                Stored::I64,
                view.data()
                    .chunks_exact(8)
                    .map(|c| {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(c);
                        i64::from_le_bytes(b) as f32
                    })
                    .collect(),
            ),
            other => {
                return Err(Error::DType {
                    name: name.to_string(),
                    found: format!("{other:?} (F32 or I64 are read)"),
                });
            }
        };
        let shape = view.shape().to_vec();
        if data.len() != shape.iter().product::<usize>() {
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                reason: format!("{name:?}: {} values for shape {shape:?}", data.len()),
            });
        }
        tensors.insert(
            name.to_string(),
            HostTensor {
                shape,
                data,
                stored,
            },
        );
    }
    let mut metadata: BTreeMap<String, String> = header
        .metadata()
        .as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    if let Some(written) = metadata.remove(DIGEST_KEY) {
        let views: Vec<_> = parsed.iter().collect();
        let found = tensor_digest(
            views
                .iter()
                .map(|(name, view)| (*name, view.shape(), view.data())),
        );
        if found != written {
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                reason: format!(
                    "its tensors are not the ones it was saved with (SHA-256 {found}, saved as \
                     {written}): the file was altered or damaged after it was written; use \
                     another checkpoint of the run or start again"
                ),
            });
        }
    }
    Ok(LoadedState { tensors, metadata })
}

/// Writes the loaded values into `params` (by name), after checking that every parameter has
/// an entry ([`Error::Missing`]), every entry a parameter ([`Error::Unexpected`]), and every
/// shape ([`Error::ShapeMismatch`]) and dtype ([`Error::DType`]) fits. Nothing is written
/// unless everything fits.
pub fn load_into(params: &[(String, Tensor)], loaded: &LoadedState) -> Result<()> {
    let missing: Vec<String> = params
        .iter()
        .filter(|(name, _)| !loaded.tensors.contains_key(name))
        .map(|(name, _)| name.clone())
        .collect();
    if !missing.is_empty() {
        return Err(Error::Missing { names: missing });
    }
    let names: std::collections::BTreeSet<&str> =
        params.iter().map(|(name, _)| name.as_str()).collect();
    let unexpected: Vec<String> = loaded
        .tensors
        .keys()
        .filter(|name| !names.contains(name.as_str()))
        .cloned()
        .collect();
    if !unexpected.is_empty() {
        return Err(Error::Unexpected { names: unexpected });
    }
    let mut writes = Vec::with_capacity(params.len());
    for (name, param) in params {
        let Some(saved) = loaded.tensors.get(name) else {
            continue;
        };
        if param.dtype() != DType::F32 {
            return Err(Error::DType {
                name: name.clone(),
                found: format!("{:?} (parameter)", param.dtype()),
            });
        }
        if saved.shape != param.shape() || saved.data.len() != param.numel() {
            return Err(Error::ShapeMismatch {
                name: name.clone(),
                expected: param.shape().to_vec(),
                found: saved.shape.clone(),
            });
        }
        writes.push((param, saved));
    }
    for (param, saved) in writes {
        param.write_from_slice(&saved.data)?;
    }
    Ok(())
}
