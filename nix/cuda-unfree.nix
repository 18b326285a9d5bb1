# nixpkgs `config.allowUnfreePredicate`: of all unfree packages, allow only NVIDIA's CUDA redistributables
# (nvcc, cudart, cuBLAS, ... are "CUDA EULA"). Anything else unfree in the closure still fails the evaluation.
let
  cudaLicenseNames = [ "CUDA EULA" ];
in
pkg:
let
  license = pkg.meta.license or [ ];
  licenses = if builtins.isList license then license else [ license ];
in
licenses != [ ]
&& builtins.all (
  license: (license.free or false) || builtins.elem (license.shortName or "") cudaLicenseNames
) licenses
