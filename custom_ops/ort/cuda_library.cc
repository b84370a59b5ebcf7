#include "cuda_library.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstring>
#include <mutex>

namespace onnxnorm {
namespace ort {
namespace {

#if defined(__APPLE__)
constexpr const char* kCudaLibraryName = "libonnxnorm_cuda_ops.dylib";
#else
constexpr const char* kCudaLibraryName = "libonnxnorm_cuda_ops.so";
#endif

std::string ThisLibraryFolder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ThisLibraryFolder), &info) == 0 || info.dli_fname == nullptr) return ".";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

std::string CudaLibraryPath() { return ThisLibraryFolder() + "/" + kCudaLibraryName; }

bool CudaLibraryPresent() {
  struct stat status{};
  return stat(CudaLibraryPath().c_str(), &status) == 0 && S_ISREG(status.st_mode);
}

const CudaLaunchers* LoadCudaLaunchers(std::string* error) {
  static std::mutex mutex;
  static CudaLaunchers launchers = {nullptr, nullptr, nullptr};  // set once; the library is never unloaded
  std::lock_guard<std::mutex> lock(mutex);
  if (launchers.launch != nullptr) return &launchers;

  const std::string path = CudaLibraryPath();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = "cannot load the onnxnorm CUDA library " + path + " (" + (why != nullptr ? why : "unknown error") + ")";
    return nullptr;
  }
  auto layout = reinterpret_cast<ArgsLayoutFn>(dlsym(handle, "onnxnorm_args_layout"));
  auto found = reinterpret_cast<CudaLaunchFn>(dlsym(handle, "onnxnorm_cuda_launch"));
  auto quantized = reinterpret_cast<CudaLaunchQuantizedFn>(dlsym(handle, "onnxnorm_cuda_launch_quantized"));
  if (layout == nullptr || found == nullptr || quantized == nullptr) {
    *error = path +
             " is not the onnxnorm CUDA library (it lacks onnxnorm_cuda_launch, "
             "onnxnorm_cuda_launch_quantized or onnxnorm_args_layout)";
    dlclose(handle);
    return nullptr;
  }
  if (std::strcmp(layout(), NormArgsLayoutJson()) != 0) {
    *error = path + " was built from other sources than this library (its NormArgs layout " + layout() +
             " differs from " + NormArgsLayoutJson() + "); rebuild both";
    dlclose(handle);
    return nullptr;
  }
  // (a library of the same NormArgs but fewer ops would refuse the newer ops' nodes at run time)
  auto op_names = reinterpret_cast<CudaOpsFn>(dlsym(handle, "onnxnorm_cuda_ops"));
  if (op_names == nullptr || std::strcmp(op_names(), CudaOpNames()) != 0) {
    *error = path + " was built for other ops than this library (its ops: " +
             (op_names != nullptr ? op_names() : "unknown, an older build") + "; this library's: " + CudaOpNames() +
             "); rebuild both";
    dlclose(handle);
    return nullptr;
  }
  // (a library of the same ops built before their rotary kernels)
  auto rotary = reinterpret_cast<CudaLaunchRotaryFn>(dlsym(handle, "onnxnorm_cuda_launch_rotary"));
  auto rotary_layout = reinterpret_cast<ArgsLayoutFn>(dlsym(handle, "onnxnorm_cuda_rotary_args_layout"));
  if (rotary == nullptr || rotary_layout == nullptr) {
    *error = path + " has no kernels of the rotary ops (an older build); rebuild both";
    dlclose(handle);
    return nullptr;
  }
  if (std::strcmp(rotary_layout(), RotaryArgsLayoutJson()) != 0) {
    *error = path + " was built from other sources than this library (its RotaryArgs layout " + rotary_layout() +
             " differs from " + RotaryArgsLayoutJson() + "); rebuild both";
    dlclose(handle);
    return nullptr;
  }
  launchers = {found, quantized, rotary};
  return &launchers;
}

}  // namespace ort
}  // namespace onnxnorm
