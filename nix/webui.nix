# The pinned llama-ui bundle (llama.cpp's web UI), the same pin `make webui` builds: the package's
# python/ninfer/serve/webui/pin.json names the llama-cpp-python sdist and its sha256; the UI source is
# vendor/llama.cpp/tools/ui inside it, and its lockfile pins every npm package by `resolved` URL and `integrity`,
# so importNpmLock fetches them without an npmDepsHash.
# ninfer's patches to that source (python/ninfer/serve/webui/patches/*.patch, in name order, as `make webui` applies
# them) are applied before the build.
# `ninfer-serve --webui-dir ${webui}` serves it (the NixOS module can pass that flag through extraFlags).
#
# Note: importNpmLock reads the lockfile of the unpacked sdist, an import-from-derivation; it cannot be built or
# evaluated on the offline test machines (no nixpkgs there), only parsed.
{
  lib,
  stdenv,
  fetchPypi,
  buildNpmPackage,
  importNpmLock,
  nodejs,
}:
let
  pin = builtins.fromJSON (builtins.readFile ../python/ninfer/serve/webui/pin.json);
  patchDir = ../python/ninfer/serve/webui/patches;
  patchNames = lib.sort lib.lessThan (
    lib.filter (lib.hasSuffix ".patch") (builtins.attrNames (builtins.readDir patchDir))
  );

  sdist = fetchPypi {
    pname = "llama_cpp_python";
    inherit (pin) version;
    sha256 = pin.sha256;
  };

  uiSource = stdenv.mkDerivation {
    pname = "llama-ui-source";
    inherit (pin) version;
    src = sdist;
    dontBuild = true;
    installPhase = ''
      cp -r ${pin.ui_dir} $out
    '';
  };
in
buildNpmPackage {
  pname = "llama-ui";
  inherit (pin) version;
  src = uiSource;
  patches = map (name: patchDir + "/${name}") patchNames;
  inherit nodejs;
  npmDeps = importNpmLock { npmRoot = uiSource; };
  npmConfigHook = importNpmLock.npmConfigHook;
  installPhase = ''
    runHook preInstall
    cp -r dist $out
    runHook postInstall
  '';
  meta = {
    description = "llama.cpp's web UI (llama-ui), from llama-cpp-python ${pin.version}, for ninfer-serve --webui-dir";
    license = lib.licenses.mit;
  };
}
