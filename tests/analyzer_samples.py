"""Small hand-written StableHLO programs whose numbers are derived by hand in the tests."""

GEMM_AND_VECTOR = """module {
  func.func @main(%a: tensor<2x3x4xf32>, %b: tensor<2x4x5xf32>, %m: tensor<4x8xf32>,
                  %w: tensor<8x16xf32>, %c: tensor<1x4x8x8xf32>, %k: tensor<6x2x3x3xf32>,
                  %g: tensor<4x3x5x5xf32>, %h: tensor<2x3x2x2xf32>) -> tensor<4xf32> {
    %0 = stablehlo.dot_general %a, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1]
         : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
    %1 = stablehlo.dot %m, %w : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    %2 = stablehlo.convolution(%c, %k) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1],
         window = {stride = [1, 1], pad = [[0, 0], [0, 0]]}
         {batch_group_count = 1 : i64, feature_group_count = 2 : i64}
         : (tensor<1x4x8x8xf32>, tensor<6x2x3x3xf32>) -> tensor<1x6x6x6xf32>
    %3 = stablehlo.convolution(%g, %h) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1],
         window = {stride = [1, 1], pad = [[0, 0], [0, 0]]}
         {batch_group_count = 2 : i64, feature_group_count = 1 : i64}
         : (tensor<4x3x5x5xf32>, tensor<2x3x2x2xf32>) -> tensor<2x2x4x4xf32>
    %4 = stablehlo.add %1, %1 : tensor<4x16xf32>
    %5 = stablehlo.rsqrt %4 : tensor<4x16xf32>
    %6 = stablehlo.transpose %5, dims = [1, 0] : (tensor<4x16xf32>) -> tensor<16x4xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %7 = stablehlo.reduce(%5 init: %zero) applies stablehlo.add across dimensions = [1]
         : (tensor<4x16xf32>, tensor<f32>) -> tensor<4xf32>
    return %7 : tensor<4xf32>
  }
}
"""

COLLECTIVES = """module attributes {mhlo.num_partitions = 4 : i32} {
  func.func @main(%x: tensor<4x16xf32>, %y: tensor<8x16xf32>, %z: tensor<4x16xbf16>) -> () {
    %0 = "stablehlo.all_gather"(%x) {all_gather_dim = 0 : i64,
         replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>}
         : (tensor<4x16xf32>) -> tensor<8x16xf32>
    %1 = "stablehlo.reduce_scatter"(%y) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %s = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {scatter_dimension = 0 : i64, replica_groups = dense<[[0, 2], [1, 3]]> : tensor<2x2xi64>}
       : (tensor<8x16xf32>) -> tensor<4x16xf32>
    %2 = "stablehlo.all_to_all"(%z) {split_dimension = 1 : i64, concat_dimension = 1 : i64,
         split_count = 4 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>}
         : (tensor<4x16xbf16>) -> tensor<4x16xbf16>
    %3 = "stablehlo.collective_permute"(%x) {
         source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}
         : (tensor<4x16xf32>) -> tensor<4x16xf32>
    %4 = "stablehlo.all_reduce"(%x) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %s = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>}
       : (tensor<4x16xf32>) -> tensor<4x16xf32>
    %5 = "stablehlo.all_reduce"(%x) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %s = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>}
       : (tensor<4x16xf32>) -> tensor<4x16xf32>
    %6 = "stablehlo.all_reduce"(%x) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %s = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<> : tensor<0x0xi64>} : (tensor<4x16xf32>) -> tensor<4x16xf32>
    return
  }
}
"""

CALLS = """module {
  func.func private @mlp(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
    %0 = stablehlo.dot %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
  func.func private @never_called(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %0 = stablehlo.multiply %x, %x : tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
  func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
    %0 = func.call @mlp(%x, %w) : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %1 = func.call @mlp(%0, %w) : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %2 = stablehlo.negate %1 : tensor<4x8xf32>
    return %2 : tensor<4x8xf32>
  }
}
"""

DYNAMIC = """module {
  func.func @main(%a: tensor<?x4xf32>) -> tensor<?x4xf32> {
    %0 = stablehlo.add %a, %a : tensor<?x4xf32>
    return %0 : tensor<?x4xf32>
  }
}
"""

UNKNOWN_OP = """module {
  func.func @main(%a: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %0 = stablehlo.cholesky %a, lower = true : tensor<4x4xf32>
    %1 = stablehlo.cholesky %0, lower = true : tensor<4x4xf32>
    return %1 : tensor<4x4xf32>
  }
}
"""
