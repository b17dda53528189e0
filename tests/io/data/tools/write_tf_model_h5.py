"""Write tiny_bert_tf/tf_model.h5 with transformers' own TF class (needs tensorflow-cpu, tf-keras and
transformers<5 in a scratch environment): TFBertModel built from the folder's config.json, its
weights set from the safetensors file through transformers' own TF<->PyTorch name conversion, saved
with save_pretrained.

    python write_tf_model_h5.py ../tiny_bert_safetensors ../tiny_bert_tf
"""

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # transformers' TF classes are Keras 2 (tf-keras)

import tf_keras.backend as K  # noqa: E402
import transformers  # noqa: E402, TID253
from safetensors.numpy import load_file  # noqa: E402
from transformers.modeling_tf_pytorch_utils import apply_transpose, convert_tf_weight_name_to_pt_weight_name  # noqa: E402, TID253


def main(source: str, target: str) -> None:
    model = transformers.TFBertModel(transformers.BertConfig.from_pretrained(source))
    model(model.dummy_inputs)  # build the variables
    state = load_file(os.path.join(source, "model.safetensors"))
    values = []
    for weight in model.weights:
        name, transpose = convert_tf_weight_name_to_pt_weight_name(
            weight.name, start_prefix_to_remove="bert.", tf_weight_shape=weight.shape
        )
        values.append((weight, apply_transpose(transpose, state[name], weight.shape)))
    K.batch_set_value(values)
    model.save_pretrained(target)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
