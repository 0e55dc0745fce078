"""Network parts the methods build on: timm backbones as tile encoders, MIL pooling heads (`mil`), layers
that keep their activations in host memory (`big`) and PatchGD's heads."""
