// A recorded call's backward hooks added to autograd nodes from C++ (msprobe_inject.pytorch.nodehook builds it).
//
// torch registers a Python hook on a node through Function._register_hook: a RemovableHandle, an OrderedDict and,
// the first time, a PyFunction{Pre,Post}Hook over that dict (~16,500 instructions each; a recorded API call adds one,
// a module call two). These add the same C++ hook torch's would wrap the callable in, holding the callable (and
// the arguments post binds before the gradients): it is called as torch calls a node hook (fn(grad_outputs) before
// the node, fn(*bound, grad_inputs, grad_outputs) after it), its result is ignored and its exception cleared (the
// tool's hooks never change a gradient nor raise into backward), and under compiled autograd it hands the callable
// to the compiled graph as torch's own hooks do.
// Built against the torch it runs with, and loaded only for that torch (nodehook.py).
#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/dynamo/compiled_autograd.h>
#include <torch/csrc/utils/pybind.h>

using torch::autograd::FunctionPostHook;
using torch::autograd::FunctionPreHook;
using torch::autograd::variable_list;

namespace {

constexpr Py_ssize_t kMaxBound = 6;  // the arguments post holds for a hook before the gradients

inline PyObject* new_ref(PyObject* o) {  // Py_NewRef is 3.10's
  Py_INCREF(o);
  return o;
}

PyObject* wrap_all(const variable_list& vs) {
  PyObject* t = PyTuple_New((Py_ssize_t)vs.size());
  if (!t) return nullptr;
  for (size_t i = 0; i < vs.size(); i++) {
    PyObject* o = vs[i].defined() ? THPVariable_Wrap(vs[i]) : new_ref(Py_None);
    if (!o) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, (Py_ssize_t)i, o);
  }
  return t;
}

// fn(*bound, *args) with the GIL held; a Python error it raises is cleared, one already set before is kept
void call(PyObject* fn, PyObject* bound, const variable_list* a, const variable_list* b) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  Py_ssize_t nb = bound ? PyTuple_GET_SIZE(bound) : 0;  // at most kMaxBound (post)
  PyObject* args[kMaxBound + 2];
  for (Py_ssize_t i = 0; i < nb; i++) args[i] = PyTuple_GET_ITEM(bound, i);
  PyObject* ga = wrap_all(*a);
  PyObject* gb = b ? wrap_all(*b) : nullptr;
  if (ga && (!b || gb)) {
    args[nb] = ga;
    args[nb + 1] = gb;
    PyObject* r = PyObject_Vectorcall(fn, args, (size_t)(nb + (b ? 2 : 1)), nullptr);
    Py_XDECREF(r);
  }
  Py_XDECREF(ga);
  Py_XDECREF(gb);
  PyErr_Clear();
  PyErr_Restore(type, value, tb);
}

struct Held {
  PyObject* fn;
  PyObject* bound;  // a tuple of the arguments fn takes before the gradients, or null
  explicit Held(PyObject* f, PyObject* b = nullptr) : fn(new_ref(f)), bound(b ? new_ref(b) : nullptr) {}
  ~Held() {
    if (Py_IsInitialized()) {  // as torch's Python hooks: after the interpreter is gone the callable is leaked
      pybind11::gil_scoped_acquire gil;
      Py_DECREF(fn);
      Py_XDECREF(bound);
    }
  }
  // the callable compiled autograd calls with the gradients alone: fn, or functools.partial(fn, *bound), made only
  // here (a hook is handed on only while compiled autograd captures a graph)
  c10::SafePyObject handed() const {
    if (!bound) return c10::SafePyObject(new_ref(fn), getPyInterpreter());
    pybind11::gil_scoped_acquire gil;
    PyObject* functools = PyImport_ImportModule("functools");
    PyObject* partial = functools ? PyObject_GetAttrString(functools, "partial") : nullptr;
    Py_XDECREF(functools);
    PyObject* args[kMaxBound + 1] = {fn};
    Py_ssize_t nb = PyTuple_GET_SIZE(bound);
    for (Py_ssize_t i = 0; i < nb; i++) args[i + 1] = PyTuple_GET_ITEM(bound, i);
    PyObject* made = partial ? PyObject_Vectorcall(partial, args, (size_t)(nb + 1), nullptr) : nullptr;
    Py_XDECREF(partial);
    if (!made) throw python_error();
    return c10::SafePyObject(made, getPyInterpreter());
  }
};

struct PreHook : FunctionPreHook {
  Held held;
  explicit PreHook(PyObject* f) : held(f) {}
  variable_list operator()(const variable_list& grads) override {
    pybind11::gil_scoped_acquire gil;
    call(held.fn, held.bound, &grads, nullptr);
    return grads;
  }
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.add_pre_hook(held.handed());
  }
};

struct PostHook : FunctionPostHook {
  Held held;
  explicit PostHook(PyObject* f, PyObject* bound = nullptr) : held(f, bound) {}
  variable_list operator()(const variable_list& grad_inputs, const variable_list& grad_outputs) override {
    pybind11::gil_scoped_acquire gil;
    call(held.fn, held.bound, &grad_inputs, &grad_outputs);
    return grad_inputs;
  }
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.add_post_hook(held.handed());
  }
};

}  // namespace

// post(t, fn, *bound): fn as a post-hook of the node that made t, as t.grad_fn.register_hook(fn) adds it, called
// as fn(*bound, grad_inputs, grad_outputs): up to kMaxBound arguments held with it, where a partial would be an
// object made and freed per recorded call; False where grad mode is off or t has no node (a leaf, a tensor made
// without grad)
static PyObject* post(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (n < 2 || n > 2 + kMaxBound || !THPVariable_Check(args[0]) || !PyCallable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "post(tensor, callable, *bound): at most 6 bound arguments");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  if (!at::GradMode::is_enabled()) Py_RETURN_FALSE;
  const auto& node = THPVariable_Unpack(args[0]).grad_fn();
  if (!node) Py_RETURN_FALSE;
  PyObject* bound = nullptr;
  if (n > 2) {
    bound = PyTuple_New(n - 2);
    if (!bound) return nullptr;
    for (Py_ssize_t i = 2; i < n; i++) PyTuple_SET_ITEM(bound, i - 2, new_ref(args[i]));
  }
  auto hook = std::make_unique<PostHook>(args[1], bound);
  Py_XDECREF(bound);  // the hook holds its own reference
  node->add_post_hook(std::move(hook));
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// hook_single(value, fn): a module call's backward capture where its value is one plain tensor, bare or in a tuple
// of one (the common input and output): the value with the tensor's alias in its place, fn the alias node's
// pre-hook (as v.grad_fn.register_prehook(fn) adds it; the alias is aten.alias, what t[...] makes), the alias's
// creation meta reset where the tensor is a view (modules._fix_view: in-place ops on it keep working); the value
// itself where no backward hook can see the tensor (grad mode off, no grad required; an empty tuple);
// NotImplemented for every other value, which the Python capture takes. Its tensor reads are C++'s: in Python each
// goes through the dump mode's __torch_function__ while it is pushed.
static PyObject* hook_single(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (n != 2 || !PyCallable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "hook_single(value, callable)");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  PyObject* value = args[0];
  PyObject* item = value;
  bool in_tuple = PyTuple_CheckExact(value);
  if (in_tuple) {
    if (PyTuple_GET_SIZE(value) == 0) return new_ref(value);
    if (PyTuple_GET_SIZE(value) != 1) Py_RETURN_NOTIMPLEMENTED;
    item = PyTuple_GET_ITEM(value, 0);
  }
  // torch.Tensor itself: THPVariable_CheckExact takes a Parameter too, which the Python capture's subclass path takes
  if (Py_TYPE(item) != (PyTypeObject*)THPVariableClass) Py_RETURN_NOTIMPLEMENTED;
  const at::Tensor& t = THPVariable_Unpack(item);
  if (t.layout() != at::kStrided || t.is_nested()) Py_RETURN_NOTIMPLEMENTED;
  if (!at::GradMode::is_enabled() || !t.requires_grad()) return new_ref(value);
  at::Tensor v = at::alias(t);
  const auto& node = v.grad_fn();
  if (!node) return new_ref(value);
  node->add_pre_hook(std::make_unique<PreHook>(args[1]));
  if (t.is_view()) {
    // a view's alias inherits its creation meta, which may forbid in-place ops (a split's chunk)
    auto* meta = torch::autograd::impl::get_view_autograd_meta(v);
    if (meta && meta->has_bw_view()) meta->set_creation_meta(torch::autograd::CreationMeta::DEFAULT);
  }
  PyObject* wrapped = THPVariable_Wrap(std::move(v));
  if (!wrapped || !in_tuple) return wrapped;
  PyObject* one = PyTuple_New(1);
  if (!one) {
    Py_DECREF(wrapped);
    return nullptr;
  }
  PyTuple_SET_ITEM(one, 0, wrapped);
  return one;
  END_HANDLE_TH_ERRORS
}

// The metadata _fastats.entries reads of a tensor before its statistics, from its TensorImpl in one call: through
// torch's Python getters that is nine calls, each with torch's error-handling frame and warning handler (~3,000
// instructions per tensor). _fastats takes the function from this module's capsule (tensor_meta), whose name
// carries the struct's version; its layout is _fastats.c's tmeta_v2. 0: read; -1: not a tensor this reads (a
// wrapper, a subclass's dispatch, symbolic sizes, no storage, any error), for _fastats to read through Python.
extern "C" {
typedef struct {
  int64_t numel;
  const void* data;
  const int64_t* sizes;  // the tensor's own, valid while it lives
  int64_t ndim;
  int f32, strided, cpu, neg, contiguous, requires_grad;
  const int64_t* strides;  // as sizes: a non-contiguous tensor's layout without its Python getter (v2)
} tmeta_v2;
}
static_assert(sizeof(tmeta_v2) == 64 && offsetof(tmeta_v2, strides) == 56, "tmeta_v2 is _fastats.c's");

static int tensor_meta(PyObject* obj, tmeta_v2* m) noexcept {
  try {
    if (!THPVariable_Check(obj)) return -1;
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.defined()) return -1;
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    // what Python's getters would answer otherwise or refuse: a subclass's or a mode's Python dispatch, functorch's
    // wrappers (their data pointer raises), functionalization, nested tensors, sizes that are symbols
    static const c10::DispatchKeySet other(
        {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::FuncTorchBatched,
         c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::Functionalize, c10::DispatchKey::NestedTensor});
    if (impl->key_set().has_any(other) || impl->has_symbolic_sizes_strides() || !impl->has_storage()) return -1;
    m->numel = impl->numel();
    m->f32 = impl->dtype() == caffe2::TypeMeta::Make<float>();
    m->strided = impl->layout() == at::kStrided;
    m->cpu = impl->is_cpu();
    m->neg = impl->is_neg();
    m->contiguous = impl->is_contiguous();
    // the storage's address as it is: Python's data_ptr() would first give a lazy clone a copy of its own, for the
    // tool's read only
    m->data = m->numel > 0 ? t.const_data_ptr() : nullptr;
    auto sizes = impl->sizes();
    m->sizes = sizes.data();
    m->ndim = (int64_t)sizes.size();
    m->strides = m->strided ? impl->strides().data() : nullptr;
    m->requires_grad = impl->requires_grad();
    return 0;
  } catch (...) {
    return -1;
  }
}

// torch's DisableTorchFunction as the tool's quiet sections enter it (_tstate.c), without its Python object: the
// thread's torch-function state read and set to ALL_DISABLED, and put back on leaving, as the object's __enter__ and
// __exit__ do. _tstate takes the functions from this module's capsule (tf_guard); its layout is _tstate.h's
// tfguard_v1, whose version the capsule's name carries.
extern "C" {
typedef struct {
  int (*enter)(void);
  void (*leave)(int);
} tfguard_v1;
}

static int tf_enter() noexcept {
  auto old = at::impl::PythonTorchFunctionTLS::get_disabled_state();
  at::impl::PythonTorchFunctionTLS::set_disabled_state(at::impl::TorchFunctionDisabledState::ALL_DISABLED);
  return static_cast<int>(old);
}

static void tf_leave(int old) noexcept {
  at::impl::PythonTorchFunctionTLS::set_disabled_state(static_cast<at::impl::TorchFunctionDisabledState>(old));
}

static const tfguard_v1 tf_guard = {tf_enter, tf_leave};

static PyMethodDef methods[] = {
    {"hook_single", (PyCFunction)(void (*)(void))hook_single, METH_FASTCALL,
     "hook_single(value, fn): value's one plain tensor through a hooked alias"},
    {"post", (PyCFunction)(void (*)(void))post, METH_FASTCALL, "post(tensor, fn, *bound): fn(*bound, grad_inputs, grad_outputs) after the node that made tensor"},
    {nullptr, nullptr, 0, nullptr}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_nodehook", nullptr, -1, methods};

PyMODINIT_FUNC PyInit__nodehook(void) {
  PyObject* m = PyModule_Create(&module_def);
  // the build's tag (the torch, Python and source it was built for): nodehook.load() refuses it under any other
  if (m && PyModule_AddStringConstant(m, "TAG", MSPROBE_NODEHOOK_TAG) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  PyObject* meta = m ? PyCapsule_New((void*)&tensor_meta, "msprobe_inject.tensor_meta.v2", nullptr) : nullptr;
  if (m && (!meta || PyModule_AddObject(m, "tensor_meta", meta) < 0)) {
    Py_XDECREF(meta);
    Py_DECREF(m);
    return nullptr;
  }
  PyObject* guard = PyCapsule_New((void*)&tf_guard, "msprobe_inject.tf_guard.v1", nullptr);
  if (!guard || PyModule_AddObject(m, "tf_guard", guard) < 0) {
    Py_XDECREF(guard);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
