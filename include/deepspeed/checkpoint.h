// DeepSpeed-compatible checkpoint files: PyTorch's zip serialization (what torch.save writes and
// torch.load reads) from C++, atomic writes and the `latest` file, DeepSpeed's directory layout,
// the model-states and ZeRO optimizer-states dicts as structs, ZeRO-1/2 consolidation into one
// fp32 state dict (zero_to_fp32), and safetensors. The engine's save_checkpoint/load_checkpoint
// orchestrate these (ranks, barriers, which tensors); this header only knows files.
// docs/checkpoints.md describes the formats; reference: deepspeed-inventory §5.4-5.5, §6.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>
#include <torch/ordered_dict.h>

#include "deepspeed/errors.h"

namespace torch::nn {
class Module;
}

namespace deepspeed::checkpoint {

using json = nlohmann::json;
/// Named tensors in order: a state dict.
using TensorDict = torch::OrderedDict<std::string, at::Tensor>;
using Shape = std::vector<int64_t>;
/// Parameter name -> shape, in order.
using ShapeDict = torch::OrderedDict<std::string, Shape>;
/// A Python dict as c10 holds it: keys (str or int) and values of any kind, insertion-ordered.
using Dict = c10::impl::GenericDict;
/// A new empty dict (keys str or int).
Dict new_dict();

// =================================================================================================
// 1. PyTorch files
// =================================================================================================

// Note [Python values in an IValue]
// A checkpoint is a Python object tree. It maps onto c10::IValue as follows (both directions):
//   None, bool, int, float, str         None, Bool, Int, Double, String
//   list / tuple / dict                 List / Tuple / GenericDict (keys str or int, ordered)
//   torch.Tensor                        Tensor (CPU on load; any device and dtype on save)
//   torch.Size                          a named tuple "torch.Size" of ints: reads as a tuple
//   set                                 loads as a List; write one with python_set()
//   collections.OrderedDict             loads as a GenericDict (its _metadata is dropped)
//   other class instance / enum value   an opaque c10 Capsule: python_object() builds one,
//                                       as_python_object() reads its class, args and state
//   a class or dtype itself (torch.float16) a Capsule too: python_global()
// Files hold only plain values, tensors and torch.Size, unless the caller puts python_set() /
// python_object() / python_global() values in: those need Python's full unpickler
// (weights_only=False), and for objects the class must be importable where it is loaded.

/// Writes `value` to `path` in torch.save's zip format (pickle protocol 2, one record per
/// tensor storage, each tensor saved compactly: views are copied out, as DeepSpeed clones them),
/// atomically: written to a temporary file in the same directory, fsync'd, renamed over `path`,
/// and the directory fsync'd (see AtomicFile). Python reads it with torch.load; a value holding
/// only plain values, tensors and torch.Size also loads with weights_only=True (torch >= 2.0;
/// 1.13's weights_only unpickler cannot read floats at all). The same tensor object written
/// twice loads as one object. Blocks until the data is durable. Throws CheckpointError naming
/// `path` on I/O failure, NotSupportedError for a value with no Python equivalent (e.g. a
/// sparse tensor); the previous file at `path`, if any, is then untouched.
void save(const c10::IValue& value, const std::string& path);

/// How save() puts the bytes on disk (DeepSpeed's checkpoint.writer.type; docs/checkpoints.md
/// "Writers"). Every mode keeps the file atomic (Note [Atomic checkpoint files]).
enum class WriteMode {
  kBuffered,  // write() through the page cache, then fsync (PYTHON, and the default)
  kDirect,    // O_DIRECT from aligned staging buffers, drained while the next one fills (FAST)
  kMock,      // serialize and count the bytes, write none: an empty file (MOCK, for timing)
};

/// What save() did, for checkpoint.writer.show_statistics.
struct WriteStats {
  int64_t bytes = 0;        // the archive's size (what was or, kMock, would have been written)
  double seconds = 0;       // serialization and writing, fsync and rename included
  bool direct_io = false;   // kDirect and the file system took O_DIRECT
  int64_t buffers = 0;      // kDirect: staging buffers drained
};

struct WriteOptions {
  WriteMode mode = WriteMode::kBuffered;
  /// kDirect: the staging memory, a multiple of 4096 (of 8192 when double: two halves).
  int64_t io_buffer_size = 64LL << 20;
  bool io_buffer_double = true;
  WriteStats* stats = nullptr;  // filled when given
};

/// save() as `options` say.
void save(const c10::IValue& value, const std::string& path, const WriteOptions& options);

/// Writes one checkpoint file: save(), or an engine's checkpoint writer, which may snapshot the
/// value and write it in the background (runtime/checkpoint/checkpoint_writer.h).
using FileSaver = std::function<void(const c10::IValue& value, const std::string& path)>;

/// Reads a file torch.save (Python, any version 1.6+ using the zip format) or save() wrote.
/// Tensors come back on the CPU, sharing storage where the file shares it. Throws
/// CheckpointError naming `path` when the file is missing, truncated, not a zip archive (the
/// legacy non-zip format included), or holds a pickle opcode or global this reader does not
/// know. numpy's numeric arrays load as Tensors, its scalars as numbers (not written back).
c10::IValue load(const std::string& path);

/// save()/load() to and from memory (no atomicity needed there). `source` names the data in
/// error messages.
std::string save_to_string(const c10::IValue& value);
c10::IValue load_from_string(const std::string& bytes, const std::string& source = "<memory>");

/// torch.Size(shape).
c10::IValue torch_size(c10::IntArrayRef shape);
bool is_torch_size(const c10::IValue& value);
/// A shape given as torch.Size, tuple or list of ints; throws CheckpointError mentioning `where`.
Shape shape_from_ivalue(const c10::IValue& value, const std::string& where);
/// A Python set of `items` (str or int).
c10::IValue python_set(std::vector<c10::IValue> items);
/// The Python global `path` itself, e.g. "torch.float16" (a dtype) or a class.
c10::IValue python_global(const std::string& path);
/// An instance of Python class `class_path` ("package.module.Class"): written as
/// Class.__new__(Class, *args) with __dict__ updated from `state` when `state` is non-empty
/// (a plain object or dataclass), else as Class(*args) (an enum value, a namedtuple).
c10::IValue python_object(const std::string& class_path, std::vector<c10::IValue> args = {},
                          std::optional<Dict> state = std::nullopt);
/// A Python object or global as read back.
struct PythonObject {
  std::string class_path;         // "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"
  bool is_global = false;         // the class/dtype itself, not an instance
  std::vector<c10::IValue> args;  // constructor arguments (an IntEnum's value, a namedtuple's)
  Dict state = new_dict();        // __dict__ (empty when none)
};
/// The object `value` represents, or nullopt when it is a plain value (torch.Size included).
std::optional<PythonObject> as_python_object(const c10::IValue& value);

/// JSON <-> Python values: objects -> dicts with str keys, integers -> int, other numbers ->
/// float. to_json throws CheckpointError naming `where` for tensors and other non-JSON values.
c10::IValue ivalue_from_json(const json& value);
json json_from_ivalue(const c10::IValue& value, const std::string& where);
/// A TensorDict as a Python dict, and back (throws CheckpointError naming `where` for a
/// non-tensor value or a non-string key).
c10::IValue ivalue_from_tensors(const TensorDict& tensors);
TensorDict tensors_from_ivalue(const c10::IValue& value, const std::string& where);

// =================================================================================================
// 2. Atomic writes
// =================================================================================================

// Note [Atomic checkpoint files]
// A crash (kill -9, power loss, disk full) during a save must never spoil the previous
// checkpoint. Every file is written to "<dir>/.<name>.tmp.<pid>.<n>" (a dot-file, so DeepSpeed's
// globs such as *_optim_states.pt never see it), fsync'd, then rename()d over its final name,
// which POSIX makes atomic; the directory is fsync'd so that the rename itself is durable.
// `latest` is written last, by global rank 0, after a barrier that every rank reaches only once
// its own files are durable (commit_checkpoint): until then `latest` names the previous tag.

/// One file written atomically. Not thread-safe; movable-from only by destruction.
class AtomicFile {
 public:
  /// Creates the temporary file next to `path` (mode 0666 minus umask, like open()).
  /// Throws CheckpointError naming the directory when it cannot be created.
  explicit AtomicFile(std::string path);
  /// Without commit(), removes the temporary file and leaves `path` as it was.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends `size` bytes; throws CheckpointError (with errno's text, e.g. "No space left on
  /// device") naming the final path.
  void write(const void* data, size_t size);
  /// Writes `size` bytes at `offset` (pwrite); for a writer that stages its own buffers. One
  /// thread at a time may write; `bytes_written` counts these too.
  void write_at(const void* data, size_t size, int64_t offset);
  /// Turns O_DIRECT on or off for the writes that follow. Returns false (and changes nothing)
  /// where the file system refuses O_DIRECT.
  bool set_direct_io(bool on);
  /// fsync, close, rename over path(), fsync the directory. Throws CheckpointError.
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  int64_t bytes_written() const { return bytes_written_; }

 private:
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  int64_t bytes_written_ = 0;
  bool committed_ = false;
};

/// Writes `content` to `path` atomically.
void write_file_atomically(const std::string& path, const std::string& content);
/// fsync of a directory, so that entries created or renamed in it survive a crash.
void fsync_directory(const std::string& dir);
/// mkdir -p; throws CheckpointError naming the component that failed.
void create_directories(const std::string& dir);

// =================================================================================================
// 3. Layout (DeepSpeed's names, reference §6.1)
// =================================================================================================

/// "latest": the file in the save directory naming the newest complete tag.
inline constexpr const char* kLatestFileName = "latest";

/// DeepSpeed's default tag: "global_step<N>".
std::string default_tag(int64_t global_steps);
/// "<save_dir>/<tag>".
std::string tag_directory(const std::string& save_dir, const std::string& tag);
/// "mp_rank_00_model_states.pt" (ZeRO 0-2; written by data-parallel rank 0).
std::string model_states_file_name(int mp_rank = 0);
/// "zero_pp_rank_<dp>_mp_rank_00_model_states.pt" (ZeRO-3: one per data-parallel rank).
std::string zero3_model_states_file_name(int dp_rank, int mp_rank = 0);
/// "[bf16_]zero_pp_rank_<dp>_mp_rank_00_optim_states.pt" (ZeRO: one per data-parallel rank;
/// the bf16_ prefix whenever bf16 is enabled).
std::string zero_optim_states_file_name(int dp_rank, int mp_rank = 0, bool bf16 = false);
/// The optimizer file of `dp_rank` in `tag_dir` as DeepSpeed's loader finds it: the name for
/// `bf16`, else the other prefix (with a warning: a bf16 checkpoint into an fp16 job or the
/// reverse), else the legacy name without the underscore before "optim_states.pt". Throws
/// CheckpointError listing the names tried.
std::string find_zero_optim_states_file(const std::string& tag_dir, int dp_rank, int mp_rank,
                                        bool bf16);
/// find_zero_optim_states_file, or nullopt where `tag_dir` holds none of those names.
std::optional<std::string> find_zero_optim_states_file_if_any(const std::string& tag_dir,
                                                              int dp_rank, int mp_rank, bool bf16);
/// A pipeline's per-layer weights (DeepSpeed's ckpt_layer_path): "layer_<idx:02d>-model_states.pt",
/// or with tensor parallelism inside the stages "layer_<idx:02d>-model_<tp:02d>-model_states.pt"
/// (tp_rank >= 0).
std::string layer_file_name(int layer_idx, int tp_rank = -1);
/// A pipeline stage's module state (the dict DeepSpeed's PipelineEngine leaves out of its
/// model-states file, ModelStates::module_in_layer_files) from the layer files in `tag_dir`, for
/// the state names `names`: "<idx>.<rest>" from layer file idx; "tied_modules.<key>.<rest>" from
/// the layer file that holds every rest of that key (DeepSpeed saves a tied module once, as the
/// layer of its first spec without forward_fn; the stages' copies are equal). Throws
/// CheckpointError naming the file or the name that is missing.
TensorDict module_from_layer_files(const std::string& tag_dir,
                                   const std::vector<std::string>& names, int tp_rank = -1);
/// Files in `dir` whose name ends with `suffix`, in natural order (rank 2 before rank 10),
/// as full paths. Dot-files (temporaries of unfinished saves) are skipped.
std::vector<std::string> list_files_with_suffix(const std::string& dir, const std::string& suffix);

/// The tag named by "<save_dir>/latest" (surrounding whitespace stripped, as DeepSpeed does), or
/// nullopt when the file does not exist (DeepSpeed then warns and loads nothing).
std::optional<std::string> read_latest(const std::string& save_dir);
/// Writes "<save_dir>/latest" = tag (no newline) atomically.
void write_latest(const std::string& save_dir, const std::string& tag);

/// The end of save_checkpoint, called on every rank after it has written (and save() has made
/// durable) its own files: fsync the tag directory, barrier(), then global rank 0 writes
/// `latest` when `save_latest`, then barrier() again so that no rank returns before `latest`
/// moved. `barrier` is the caller's collective over all ranks (e.g. comm::barrier); pass a
/// no-op for a single process. See Note [Atomic checkpoint files].
void commit_checkpoint(const std::string& save_dir, const std::string& tag, bool is_global_rank0,
                       bool save_latest, const std::function<void()>& barrier);

// =================================================================================================
// 4. The model-states file (reference §6.2)
// =================================================================================================

/// checkpoint_parallel_dimensions.
struct ParallelDimensions {
  int64_t pp_degree = 1;
  int64_t tp_degree = 1;
};

/// mp_rank_XX_model_states.pt, key for key as DeepSpeed writes it (_common_checkpoint_state).
/// The engine fills it on save; load fills it from the file. Optional members are written as
/// None when empty, as DeepSpeed does for the setups that lack them.
struct ModelStates {
  TensorDict module;                       // the module's state_dict (module_state_dict())
  /// A pipeline's (DeepSpeed's PipelineEngine): 'module' is None in the file, the weights are
  /// in the layer_XX-model_states.pt files (module_from_layer_files). `module` is then empty.
  bool module_in_layer_files = false;
  std::vector<std::string> buffer_names;   // persistent buffers, in traversal order
  c10::IValue optimizer;                   // non-ZeRO: optimizer state dict; ZeRO: None
  /// ZeRO: per optimizer param group, name -> shape in flattening order (torch.Size in the file).
  std::optional<std::vector<ShapeDict>> param_shapes;
  /// ZeRO >= 2 unless frozen parameters are excluded: name -> shape / full CPU tensor.
  std::optional<ShapeDict> frozen_param_shapes;
  std::optional<TensorDict> frozen_param_fragments;
  /// ZeRO: alias name -> name of the parameter holding the data (tied weights).
  std::optional<std::vector<std::pair<std::string, std::string>>> shared_params;
  c10::IValue lr_scheduler;                // None or the scheduler's state dict
  c10::IValue data_sampler;                // None (curriculum data sampler state)
  c10::IValue random_ltd;                  // None (random-LTD state)
  std::vector<std::string> sparse_tensor_module_names;  // a set in the file
  int64_t skipped_steps = 0;
  int64_t global_steps = 0;
  int64_t global_samples = 0;  // from_ivalue: -1 when the file has none (DeepSpeed then uses
                               // global_steps * train_batch_size)
  int64_t dp_world_size = 1;
  int64_t mp_world_size = 1;
  ParallelDimensions checkpoint_parallel_dimensions;
  json ds_config = json::object();         // the user's ds_config verbatim
  std::string ds_version;                  // DeepSpeed version this matches (kDeepSpeedCompatVersion)
  /// The client_state keys, merged at the top level (overriding same-named keys, as
  /// DeepSpeed's state.update(client_state)); on load: every key not listed above.
  std::vector<std::pair<std::string, c10::IValue>> client_state;

  /// The dict to save(). Throws UsageError when client_state holds the reserved key
  /// "checkpoint_parallel_dimensions" (DeepSpeed raises KeyError).
  c10::IValue to_ivalue() const;
  /// Parses a loaded dict; `source` (the file) is named in errors. Accepts DeepSpeed's Python
  /// files (OrderedDict, torch.Size, set, missing optional keys). Throws CheckpointError for a
  /// missing `module` or a value of the wrong type.
  static ModelStates from_ivalue(const c10::IValue& value, const std::string& source);
};

/// The state names a model-states file lists without its module: every param_shapes group,
/// frozen_param_shapes and buffer_names.
std::vector<std::string> listed_state_names(const ModelStates& states);

/// What DeepSpeed's load_checkpoint returns as client_state: every top-level key of the loaded
/// model-states dict except module, sparse_tensor_module_names, skipped_steps, global_steps,
/// dp_world_size, mp_world_size, data_sampler and random_ltd (only module with
/// `load_module_only`), plus lr_scheduler when `lr_scheduler_loaded` and optimizer when
/// `optimizer_loaded`. So internal keys such as buffer_names and ds_config come back too.
Dict client_state_of(const c10::IValue& model_states, bool load_module_only,
                     bool lr_scheduler_loaded, bool optimizer_loaded);

/// The module's state_dict in PyTorch's order (per module: its parameters, then its buffers,
/// then its children recursively), detached tensors aliasing the module's.
TensorDict module_state_dict(const torch::nn::Module& module);
/// Names of the module's buffers in that traversal order (C++ buffers are all persistent).
std::vector<std::string> module_buffer_names(const torch::nn::Module& module);
/// Copies `state` into the module's parameters and buffers (under NoGradGuard, cast to each
/// one's dtype and device). Returns the keys missing from `state` and those it has in excess;
/// with `strict` either kind throws CheckpointError listing them (like PyTorch's
/// load_state_dict), as does any shape mismatch. `source` is named in errors.
struct LoadStateResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};
LoadStateResult load_module_state_dict(torch::nn::Module& module, const TensorDict& state,
                                       bool strict, const std::string& source);

// =================================================================================================
// 5. The ZeRO-1/2 optimizer-states file (reference §6.3)
// =================================================================================================

/// DeepSpeed's loss scaler object (runtime/fp16/loss_scaler.py), saved as the Python object
/// DynamicLossScaler (dynamic) or LossScaler (static; bf16 and fp32 use LossScaler(1.0)).
struct LossScalerState {
  bool dynamic = false;
  double cur_scale = 1.0;
  // The rest exist only for the dynamic scaler.
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;
  double scale_factor = 2.0;
  int64_t scale_window = 1000;
  double min_scale = 1.0;
  int64_t delayed_shift = 2;
  int64_t cur_hysteresis = 2;
  bool consecutive_hysteresis = false;
  bool raise_error_at_min_scale = true;
  at::ScalarType dtype = at::kHalf;

  /// DeepSpeed's pickled object, or (`as_object` false) a plain dict of its attributes
  /// with the dtype as a string ("torch.float16").
  c10::IValue to_ivalue(bool as_object = true) const;
  /// From the object DeepSpeed pickled (or a plain dict of the same attributes).
  static LossScalerState from_ivalue(const c10::IValue& value, const std::string& where);
};

/// DeepSpeed's fragment_address(numel, start): a parameter's piece of this rank's partition.
struct FragmentAddress {
  int64_t numel = 0;
  int64_t start = 0;
};

/// The "optimizer_state_dict" of zero_pp_rank_R_..._optim_states.pt (ZeRO 1/2).
struct ZeroOptimizerStates {
  LossScalerState loss_scaler;
  bool dynamic_loss_scale = false;
  bool overflow = false;
  double clip_grad = 0.0;
  /// The inner optimizer over this rank's flat fp32 partitions (optim::optimizer_state_dict).
  c10::IValue base_optimizer_state;
  /// This rank's fp32 master partition per param group, alignment padding removed (only the
  /// ranks whose slice reaches the padding hold fewer elements).
  std::vector<at::Tensor> single_partition_of_fp32_groups;
  int64_t zero_stage = 2;                  // 1 or 2 (1 for BF16_Optimizer's)
  std::vector<int64_t> group_paddings;     // padding elements in this rank's slice, per group
  std::vector<int64_t> partition_count;    // data-parallel size, per group
  std::string ds_version;
  /// Per group: parameter name -> its piece of this rank's partition.
  std::vector<torch::OrderedDict<std::string, FragmentAddress>> param_slice_mappings;
  /// Other keys found on load (e.g. base_optimizer_state_step of elastic checkpoints); written
  /// back as they are.
  std::vector<std::pair<std::string, c10::IValue>> extra;
  /// Write the loss scaler and the fragment addresses as DeepSpeed's Python objects (Python
  /// DeepSpeed can resume from the file; torch.load needs weights_only=False and DeepSpeed
  /// importable) or, when false, as plain dicts (weights_only=True loads the file).
  bool python_objects = true;
  /// DeepSpeed's BF16_Optimizer state_dict (bf16 under pipeline parallelism, or ZeRO-1 with fp32
  /// gradient accumulation): the same partitions, but no zero_stage, loss scaler or overflow
  /// flag, and each partition stored with its padding. In memory the partitions are without
  /// it, as ZeRO's: from_ivalue strips group_paddings, to_ivalue pads them back with zeros.
  bool bf16_optimizer = false;

  /// DeepSpeed's elastic layout (zero_optimization.elastic_checkpoint): base_optimizer_state is
  /// a list with one dict per param group, the state of the group's flat partition with every
  /// per-element tensor cut to the partition's real elements (padding dropped, as the fp32
  /// partitions), and the step count under "base_optimizer_state_step" (in `extra`). It has no
  /// param_groups: DeepSpeed does not restore hyper-parameters from it. The rigid layout holds
  /// the inner optimizer's state_dict.
  bool elastic() const { return base_optimizer_state.isList(); }
  /// Rigid -> elastic, as DeepSpeed's state_dict() with elastic_checkpoint. The step is written
  /// from the state (0 before the first step), so that DeepSpeed's loaders, which require it,
  /// read the file with any optimizer. DeepSpeed copies the states into its optimizer as they
  /// are, so each state's "step" takes the type that optimizer keeps: a float32 scalar tensor
  /// for torch's Adam/AdamW (`step_as_tensor`), a number for DeepSpeedCPUAdam.
  void make_elastic(bool step_as_tensor);
  /// Elastic -> rigid: each per-element tensor padded back with zeros by group_paddings, the
  /// step put into each state that lacks one, and `param_groups` (the running optimizer's, one
  /// flat parameter per group) as the hyper-parameters. Throws CheckpointError naming `source`
  /// when the groups or the element counts do not match the fp32 partitions.
  void make_rigid(const c10::IValue& param_groups, const std::string& source);

  c10::IValue to_ivalue() const;
  static ZeroOptimizerStates from_ivalue(const c10::IValue& value, const std::string& source);
  /// DeepSpeed's resume rule: the partitions can only be loaded by as many data-parallel ranks
  /// as wrote them. Throws CheckpointError naming `source`, both sizes and the ways out.
  void check_partition_count(int64_t dp_world_size, const std::string& source) const;
};

/// The whole optimizer file: {"optimizer_state_dict", "ds_config", "ds_version"}.
struct ZeroOptimizerFile {
  ZeroOptimizerStates optimizer_state_dict;
  json ds_config = json::object();
  std::string ds_version;

  c10::IValue to_ivalue() const;
  static ZeroOptimizerFile from_ivalue(const c10::IValue& value, const std::string& source);
};

// =================================================================================================
// 6. Consolidation (zero_to_fp32, reference §6.4) and safetensors
// =================================================================================================

struct ConsolidateOptions {
  /// Leave out frozen parameters (zero_to_fp32's --exclude_frozen_parameters).
  bool exclude_frozen_parameters = false;
};

/// The full fp32 state dict of a ZeRO checkpoint (ours or Python DeepSpeed's): buffers (cast
/// to fp32), then frozen parameters (as saved), then the trainable parameters. Stage 1/2: every
/// rank's fp32 partition of a param group concatenated in rank order, padding dropped, cut by
/// param_shapes. Stage 3 (Python DeepSpeed's files): each parameter's ceil(numel/W) elements
/// per rank gathered from every rank's flat partition. Several model-parallel ranks (tensor
/// parallelism, pipeline stages, both) and ZeRO-0 (fp32 masters in the model states) are read
/// as ds_to_universal reads them: split parameters joined, each stage's layers by their global
/// names. Tied parameters (shared_params) alias
/// their source tensor; tensors may be views of one buffer per group. `tag` defaults to
/// "<checkpoint_dir>/latest". Throws CheckpointError naming the file and what is wrong: no
/// `latest`, a missing rank file, partition_count differing between files, a file that is
/// truncated or not a ZeRO checkpoint, element counts that do not add up.
TensorDict consolidate_zero_checkpoint(const std::string& checkpoint_dir,
                                       const std::optional<std::string>& tag = std::nullopt,
                                       const ConsolidateOptions& options = {});

/// zero_to_fp32's guard for its OUTPUT file (existing or not): throws UsageError when, after
/// resolving symlinks (and hard links for an existing file), it is "<checkpoint_dir>/latest",
/// lies inside "<checkpoint_dir>/<tag>" (tag: `latest`'s when nullopt), or is one of that
/// folder's files. A file beside `latest` (DeepSpeed's `zero_to_fp32.py . pytorch_model.bin`
/// habit) is fine.
void check_output_outside_checkpoint(const std::string& output, const std::string& checkpoint_dir,
                                     const std::optional<std::string>& tag);

/// Writes `tensors` in the safetensors format (8-byte little-endian header length, JSON header
/// {name: {dtype, shape, data_offsets}, "__metadata__": metadata}, then the raw little-endian
/// data), atomically. Tensors are copied to contiguous CPU memory; aliases are written as
/// separate copies. Throws NotSupportedError for dtypes safetensors lacks.
void save_safetensors(const TensorDict& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
/// Reads a safetensors file (in file order of the data). Throws CheckpointError naming `path`
/// for a truncated file, a malformed header or offsets outside the data.
TensorDict load_safetensors(const std::string& path);

}  // namespace deepspeed::checkpoint
