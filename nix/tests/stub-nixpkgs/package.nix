# Stand-in for the ninfer package: a store path whose bin/ninfer-serve exists and is executable, so that a rendered
# unit's ExecStart names a real file for `systemd-analyze verify`. It builds offline with /bin/sh; the tests' Nix
# builds without a sandbox, so the host's coreutils are reachable through PATH.
{
  system ? builtins.currentSystem,
}:
let
  script = builtins.toFile "ninfer-serve" ''
    #!/bin/sh
    echo "ninfer-serve test stand-in: $*"
  '';
in
derivation {
  name = "ninfer-stub-0";
  inherit system;
  builder = "/bin/sh";
  args = [
    "-c"
    "PATH=/usr/bin:/bin; mkdir -p $out/bin && cp ${script} $out/bin/ninfer-serve && chmod 555 $out/bin/ninfer-serve"
  ];
}
// {
  meta.mainProgram = "ninfer-serve";
}
