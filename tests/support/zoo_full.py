"""The model zoo: at least 25 random-init architectures for ``make test-full``, by family.

Each factory takes no arguments and returns ``(model, example_inputs)`` with weights from a fixed
seed (nothing is downloaded). Configs are tiny (2 layers, hidden 32) so that a model compiles in
seconds; randomness that would make training differ between two runs (dropout, layer drop, time
masking) is off.

Example::

    from tests.support import zoo_full
    family, make = zoo_full.ZOO["gpt_neox"]
    model, inputs = make()
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.support import zoo

_seeded = zoo._seeded
_ids = zoo._ids
_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
_TOKENS = dict(vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _image(size=32, batch=2):
    return torch.randn(batch, 3, size, size)


# --- text: decoders --------------------------------------------------------------------------

@_seeded
def gpt_neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    cfg = GPTNeoXConfig(max_position_embeddings=64, **_TOKENS, **_TINY)
    return GPTNeoXForCausalLM(cfg), (_ids(),)


@_seeded
def phi():
    from transformers import PhiConfig, PhiForCausalLM
    cfg = PhiConfig(max_position_embeddings=64, **_TOKENS, **_TINY)
    return PhiForCausalLM(cfg), (_ids(),)


@_seeded
def gemma():
    from transformers import GemmaConfig, GemmaForCausalLM
    cfg = GemmaConfig(num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      **_TOKENS, **_TINY)
    return GemmaForCausalLM(cfg), (_ids(),)


@_seeded
def opt():
    from transformers import OPTConfig, OPTForCausalLM
    cfg = OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                    word_embed_proj_dim=32, max_position_embeddings=64, dropout=0.0,
                    attention_dropout=0.0, layerdrop=0.0, **_TOKENS)
    return OPTForCausalLM(cfg), (_ids(),)


@_seeded
def bloom():
    from transformers import BloomConfig, BloomForCausalLM
    cfg = BloomConfig(hidden_size=32, n_layer=2, n_head=4, hidden_dropout=0.0,
                      attention_dropout=0.0, **_TOKENS)
    return BloomForCausalLM(cfg), (_ids(),)


@_seeded
def falcon():
    from transformers import FalconConfig, FalconForCausalLM
    cfg = FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       hidden_dropout=0.0, attention_dropout=0.0, **_TOKENS)
    return FalconForCausalLM(cfg), (_ids(),)


@_seeded
def starcoder2():
    from transformers import Starcoder2Config, Starcoder2ForCausalLM
    cfg = Starcoder2Config(num_key_value_heads=2, max_position_embeddings=64, residual_dropout=0.0,
                           embedding_dropout=0.0, attention_dropout=0.0, **_TOKENS, **_TINY)
    return Starcoder2ForCausalLM(cfg), (_ids(),)


# --- text: encoders and encoder-decoders -----------------------------------------------------

@_seeded
def roberta():
    from transformers import RobertaConfig, RobertaForMaskedLM
    cfg = RobertaConfig(max_position_embeddings=64, **_NO_DROPOUT, **_TOKENS, **_TINY)
    return RobertaForMaskedLM(cfg), (_ids(vocab=90) + 3,)


@_seeded
def distilbert():
    from transformers import DistilBertConfig, DistilBertForMaskedLM
    cfg = DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                           max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                           pad_token_id=0)
    return DistilBertForMaskedLM(cfg), (_ids(),)


@_seeded
def albert():
    from transformers import AlbertConfig, AlbertForMaskedLM
    cfg = AlbertConfig(embedding_size=16, max_position_embeddings=64, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
                       **_TOKENS, **_TINY)
    return AlbertForMaskedLM(cfg), (_ids(),)


@_seeded
def electra():
    from transformers import ElectraConfig, ElectraForMaskedLM
    cfg = ElectraConfig(embedding_size=32, max_position_embeddings=64, **_NO_DROPOUT,
                        **_TOKENS, **_TINY)
    return ElectraForMaskedLM(cfg), (_ids(),)


@_seeded
def deberta_v2():
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM
    cfg = DebertaV2Config(max_position_embeddings=64, relative_attention=True,
                          pos_att_type=["p2c", "c2p"], position_buckets=16, **_NO_DROPOUT,
                          **_TOKENS, **_TINY)
    return DebertaV2ForMaskedLM(cfg), (_ids(),)


@_seeded
def bart():
    from transformers import BartConfig, BartForConditionalGeneration
    cfg = BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                     max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                     activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
                     decoder_start_token_id=2, use_cache=False, **_TOKENS)
    return BartForConditionalGeneration(cfg), (_ids(), None, _ids(seq=6))


# --- vision ----------------------------------------------------------------------------------

@_seeded
def deit():
    from transformers import DeiTConfig, DeiTForImageClassification
    cfg = DeiTConfig(image_size=32, patch_size=8, num_labels=10, **_NO_DROPOUT, **_TINY)
    return DeiTForImageClassification(cfg), (_image(),)


@_seeded
def convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification
    cfg = ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                         patch_size=2, num_labels=10, drop_path_rate=0.0)
    return ConvNextForImageClassification(cfg), (_image(),)


@_seeded
def swin():
    from transformers import SwinConfig, SwinForImageClassification
    cfg = SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                     window_size=4, num_labels=10, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, drop_path_rate=0.0)
    return SwinForImageClassification(cfg), (_image(),)


@_seeded
def resnet_hf():
    from transformers import ResNetConfig, ResNetForImageClassification
    cfg = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                       layer_type="bottleneck", num_labels=10)
    return ResNetForImageClassification(cfg), (_image(),)


@_seeded
def segformer():
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    cfg = SegformerConfig(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                          hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                          num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32,
                          num_labels=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                          classifier_dropout_prob=0.0, drop_path_rate=0.0)
    return SegformerForSemanticSegmentation(cfg), (_image(),)


@_seeded
def mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    cfg = MobileNetV2Config(num_channels=3, image_size=64, depth_multiplier=0.25, num_labels=10,
                            finegrained_output=False,
                            classifier_dropout_prob=0.0)
    # Training-mode BatchNorm over 2 images at 1x1 resolution (the last stages at 32x32)
    # normalizes by the spread of two numbers and amplifies float rounding past any tolerance;
    # 4 images of 64x64 keep it well-conditioned.
    return MobileNetV2ForImageClassification(cfg), (_image(64, batch=4),)


# --- audio -----------------------------------------------------------------------------------

_SPEECH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
               num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=32,
               hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
               feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
               mask_feature_prob=0.0, do_stable_layer_norm=True, feat_extract_norm="layer")


@_seeded
def wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
    return Wav2Vec2ForCTC(Wav2Vec2Config(**_SPEECH)), (torch.randn(2, 400),)


@_seeded
def hubert():
    from transformers import HubertConfig, HubertForCTC
    return HubertForCTC(HubertConfig(**_SPEECH)), (torch.randn(2, 400),)


# --- multimodal ------------------------------------------------------------------------------

@_seeded
def siglip():
    from transformers import SiglipConfig, SiglipModel
    text = dict(vocab_size=100, max_position_embeddings=16, pad_token_id=1, bos_token_id=0,
                eos_token_id=2, **_TINY)
    vision = dict(image_size=32, patch_size=8, **_TINY)
    cfg = SiglipConfig(text_config=text, vision_config=vision)
    return SiglipModel(cfg), (_ids(seq=8), _image())


# --- mixture of experts ----------------------------------------------------------------------

_MOE = dict(num_key_value_heads=2, max_position_embeddings=64, **_TOKENS, **_TINY)


@_seeded
def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **_MOE)
    return MixtralForCausalLM(cfg), (_ids(),)


@_seeded
def qwen2_moe():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    cfg = Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         shared_expert_intermediate_size=64, decoder_sparse_step=1, **_MOE)
    return Qwen2MoeForCausalLM(cfg), (_ids(),)


@_seeded
def olmoe():
    from transformers import OlmoeConfig, OlmoeForCausalLM
    cfg = OlmoeConfig(num_experts=4, num_experts_per_tok=2, **_MOE)
    return OlmoeForCausalLM(cfg), (_ids(),)


# --- detection -------------------------------------------------------------------------------

def _resnet_backbone(out_indices, rt_detr=False):
    """A 4-stage ResNet of 8-64 channels, one basic block each."""
    from transformers import ResNetConfig, RTDetrResNetConfig
    config = RTDetrResNetConfig if rt_detr else ResNetConfig
    return config(embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                  layer_type="basic", out_indices=out_indices)


_DETECTION = dict(num_queries=30, d_model=32, encoder_layers=2, decoder_layers=2,
                  encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
                  decoder_attention_heads=4, dropout=0.0)


def _rt_detr_config(config_class, **overrides):
    # Deformable attention (grid_sample) over 3 levels, 30 queries chosen by topk. At the
    # default initializer_range (0.01) eval mode shrinks the features to ~1e-9 and all 84
    # encoder scores of an image round to one float32: the queries are then chosen by how
    # topk breaks ties, which eager leaves unspecified (numerics.locate says so). At 0.2 the
    # scores lie 1e-3 apart around the 30th.
    settings = dict(backbone_config=_resnet_backbone([2, 3, 4], rt_detr=True),
                    encoder_in_channels=[16, 32, 64], encoder_hidden_dim=32,
                    encoder_ffn_dim=64, encoder_attention_heads=4, d_model=32, num_queries=30,
                    decoder_in_channels=[32, 32, 32], decoder_ffn_dim=64, num_feature_levels=3,
                    decoder_n_points=4, decoder_layers=2, decoder_attention_heads=4,
                    num_denoising=0, disable_custom_kernels=True, initializer_range=0.2)
    return config_class(**{**settings, **overrides})


@_seeded
def rt_detr_v2(**overrides):
    from transformers import RTDetrV2Config, RTDetrV2Model
    return RTDetrV2Model(_rt_detr_config(RTDetrV2Config, **overrides)), (_image(64, batch=3),)


@_seeded
def rt_detr():
    from transformers import RTDetrConfig, RTDetrModel
    return RTDetrModel(_rt_detr_config(RTDetrConfig)), (_image(64, batch=3),)


@_seeded
def deformable_detr():
    # Two-stage with box refinement: the heads are those of the detection model.
    from transformers import DeformableDetrConfig, DeformableDetrForObjectDetection
    cfg = DeformableDetrConfig(backbone_config=_resnet_backbone([2, 3, 4]), num_feature_levels=4,
                               two_stage=True, with_box_refine=True, two_stage_num_proposals=30,
                               disable_custom_kernels=True, **_DETECTION)
    return DeformableDetrForObjectDetection(cfg), (_image(64),)


@_seeded
def conditional_detr():
    from transformers import ConditionalDetrConfig, ConditionalDetrModel
    cfg = ConditionalDetrConfig(backbone_config=_resnet_backbone([4]), **_DETECTION)
    return ConditionalDetrModel(cfg), (_image(64),)


@_seeded
def detr():
    from transformers import DetrConfig, DetrModel
    return DetrModel(DetrConfig(backbone_config=_resnet_backbone([4]), **_DETECTION)), \
        (_image(64),)


# --- hand-written CNNs (timm would pull a torch and torchvision that do not fit the pin) -----

class ResidualBlock(nn.Module):
    """ResNet basic block: two 3x3 convolutions with BatchNorm, strided shortcut when needed."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise (groups = channels), 1x1 project."""

    def __init__(self, cin, cout, stride, expand=4):
        super().__init__()
        mid = cin * expand
        self.use_residual = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
            nn.ReLU6(),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_residual else y


def resnet_mini():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        ResidualBlock(16, 16), ResidualBlock(16, 32, stride=2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return model, (_image(),)


def mobilenet_mini():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish(),
        InvertedResidual(16, 16, 1), InvertedResidual(16, 24, 2), InvertedResidual(24, 24, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.0), nn.Linear(24, 10))
    return model, (_image(),)


def unet_mini():
    """Encoder-decoder with a transposed convolution and a skip connection (segmentation)."""
    torch.manual_seed(0)

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.GroupNorm(2, 8), nn.SiLU())
            self.bottom = nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1), nn.GroupNorm(4, 16), nn.SiLU())
            self.up = nn.ConvTranspose2d(16, 8, 2, 2)
            self.head = nn.Conv2d(16, 5, 1)

        def forward(self, x):
            skip = self.down(x)
            y = self.up(self.bottom(skip))
            return self.head(torch.cat([y, skip], 1)).permute(0, 2, 3, 1)

    return UNet(), (_image(16),)


ZOO = {
    **{name: ("text", zoo.TRANSFORMERS[name]) for name in ("gpt2", "llama", "qwen2", "mistral",
                                                           "bert", "t5")},
    **{f.__name__: ("text", f) for f in (gpt_neox, phi, gemma, opt, bloom, falcon, starcoder2,
                                          roberta, distilbert, albert, electra, deberta_v2,
                                          bart)},
    "vit": ("vision", zoo.vit),
    **{f.__name__: ("vision", f) for f in (deit, convnext, swin, resnet_hf, segformer,
                                            mobilenet_v2)},
    **{f.__name__: ("detection", f) for f in (rt_detr_v2, rt_detr, deformable_detr,
                                               conditional_detr, detr)},
    "whisper": ("audio", zoo.whisper),
    **{f.__name__: ("audio", f) for f in (wav2vec2, hubert)},
    "clip": ("multimodal", zoo.clip),
    "siglip": ("multimodal", siglip),
    **{f.__name__: ("moe", f) for f in (mixtral, qwen2_moe, olmoe)},
    **{f.__name__: ("cnn", f) for f in (resnet_mini, mobilenet_mini, unet_mini)},
}
